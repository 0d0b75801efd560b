"""The weight checksum is a function of the bytes alone (the same on any device, whatever the
tensor's layout), changes with any one word, with order and with length; the finite checks
name the tensor with a NaN or an infinity, even inside a bucket."""

import pytest
import torch

from gpu import weight_check
from gpu.weight_check import DeferredChecks, WeightError, checksum, finite_on_device
from tests.devices import needs_cuda


def sample(numel: int, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(numel)).to(dtype)


@pytest.mark.parametrize("numel", [0, 1, 3, 1023, 1024, 4097, 70_001])
def test_the_checksum_is_of_the_bytes(numel):
    t = sample(numel, torch.bfloat16)
    assert checksum(t) == checksum(t.clone()) == checksum(t.view(torch.int16))
    assert len(checksum(t)) == 16
    if numel:
        for where in (0, numel // 2, numel - 1):
            changed = t.clone()
            changed[where] += 1
            assert checksum(changed) != checksum(t)


def test_order_length_and_layout():
    t = sample(4096)
    assert checksum(t.flip(0)) != checksum(t)
    assert checksum(torch.zeros(4)) != checksum(torch.zeros(8))
    matrix = sample(600).view(20, 30)
    assert checksum(matrix.t()) == checksum(matrix.t().contiguous())  # row-major values, not storage
    assert checksum(matrix[:, 1:]) == checksum(matrix[:, 1:].contiguous())
    odd = torch.arange(7, dtype=torch.uint8)
    assert checksum(odd) != checksum(torch.arange(6, dtype=torch.uint8))
    assert checksum(torch.ones(5, dtype=torch.bool)) == checksum(torch.ones(5, dtype=torch.uint8))


def test_the_checksum_does_not_depend_on_the_pass_size(monkeypatch):
    t = sample(300_000)
    whole = checksum(t)
    monkeypatch.setattr(weight_check, "_CHUNK_ROWS", 7)
    assert checksum(t) == whole


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.uint8])
def test_the_checksum_is_the_same_on_cuda(dtype):
    t = (sample(5_000_001) * 50).to(dtype)
    assert checksum(t.cuda()) == checksum(t)


def test_finite_checks_name_the_tensor():
    assert finite_on_device(sample(10)).item()
    assert finite_on_device(torch.arange(4)).item() and finite_on_device(torch.zeros(0)).item()
    for bad in (float("nan"), float("inf"), -float("inf")):
        t = sample(10, torch.bfloat16)
        t[3] = bad
        assert not finite_on_device(t).item()
    bucket = torch.cat([sample(5), sample(6), sample(7)])
    bucket[8] = float("nan")  # in the second tensor
    parts = dict(zip("abc", bucket.split([5, 6, 7])))
    checks = DeferredChecks()
    checks.finite(["a", "b", "c"], bucket)
    with pytest.raises(WeightError, match="^b has NaN or infinite values$"):
        checks.verify(parts.__getitem__)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_finite_values_whose_sum_overflows_pass(dtype):
    """The fast check sums in float32; a sum that overflows is not taken for an infinity."""
    big = torch.full((8,), 3e38, dtype=dtype)
    assert not finite_on_device(big).item()  # the sum overflowed: the group is searched exactly
    checks = DeferredChecks()
    checks.finite(["big"], big)
    checks.verify(lambda name: big)


def test_checksums_are_compared_at_the_end():
    t = sample(100)
    checks = DeferredChecks()
    checks.finite(["w"], t)
    checks.checksum("w", t, checksum(t).upper())
    checks.verify(lambda name: t)
    checks.checksum("v", t, "0" * 16)
    with pytest.raises(WeightError, match=f"^v arrived with checksum {checksum(t)}, the trainer's is 0{{16}}$"):
        checks.verify(lambda name: t)


def test_a_bucket_is_checked_in_runs_of_one_dtype():
    from gpu.weight_group import dtype_runs

    like = [torch.zeros(3), torch.zeros(2), torch.zeros(3, dtype=torch.bfloat16), torch.zeros(1), torch.zeros(2)]
    bucket = torch.cat([t.reshape(-1).view(torch.uint8) for t in like])  # the last float32 starts off alignment
    runs = dtype_runs(bucket, like)
    assert [members for members, _ in runs] == [[0, 1], [2], [3], [4]]
    assert [values.dtype for _, values in runs] == [torch.float32, torch.bfloat16, torch.float32, torch.float32]
    assert sum(values.numel() for _, values in runs) == sum(t.numel() for t in like)


def test_tensors_back_to_back_in_one_storage_are_checked_as_one_run():
    """A flattened bucket's views: neighbours of one dtype become one view; a dtype change, a gap
    or another storage starts a new run; every name stays with its run."""
    bucket = torch.zeros(64, dtype=torch.uint8)
    first, second = bucket[0:16].view(torch.bfloat16), bucket[16:32].view(torch.bfloat16)
    other_dtype, after_gap = bucket[32:40].view(torch.float32), bucket[48:64].view(torch.float32)
    elsewhere = torch.zeros(4, dtype=torch.float32)
    runs = weight_check.adjacent_runs(
        [("a", first), ("b", second), ("c", other_dtype), ("d", after_gap), ("e", elsewhere)]
    )
    assert [names for names, _ in runs] == [["a", "b"], ["c"], ["d"], ["e"]]
    assert runs[0][1].numel() == 16 and runs[0][1].data_ptr() == first.data_ptr()
    second[3] = float("nan")
    checks = DeferredChecks()
    for names, values in runs:
        checks.finite(names, values)
    lookup = {"a": first, "b": second, "c": other_dtype, "d": after_gap, "e": elsewhere}
    with pytest.raises(WeightError, match="^b has NaN"):
        checks.verify(lookup.__getitem__)
