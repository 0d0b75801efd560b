"""The safetensors stream gives every tensor as it was written, whether it lies inside one chunk or
spans several, onto the CPU or a GPU; reads only the tensors asked for; and names a file that is
cut short, corrupt or not safetensors at all."""

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from gpu import safetensors_stream
from gpu.safetensors_stream import read_header, stream_tensors
from tests.devices import needs_cuda

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, needs_cuda])]


def written(tmp_path):
    generator = torch.Generator().manual_seed(0)
    tensors = {
        "a.weight": torch.randn(7, 13, generator=generator).to(torch.bfloat16),
        "b.scalar": torch.tensor(3.5),
        "c.ids": torch.randint(-5, 5, (40,), generator=generator),
        "d.mask": torch.rand(9, generator=generator) > 0.5,
        "e.empty": torch.zeros(0, 4, dtype=torch.float16),
        "f.big": torch.randn(300, generator=generator),
        "g.empty": torch.zeros(0),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, path, metadata={"format": "pt"})
    return path, tensors


def raw_file(path, header: dict, data: bytes):
    """A file with exactly this header and data, as safetensors lays them out."""
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)
    return path


def entry(dtype: str, shape: list[int], begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def streamed(path, names, device="cpu"):
    """{name: tensor on the CPU} of the named tensors, and the bytes read."""
    read: list[int] = []
    wanted = [t for t in read_header(path) if t.name in names]
    tensors = {s.name: t.cpu() for s, t in stream_tensors(path, wanted, torch.device(device), read.append)}
    return tensors, sum(read)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chunk_bytes", [48, 1000, 1 << 20])  # tensors span chunks; many tensors per chunk; one chunk
def test_every_tensor_arrives_as_written(tmp_path, monkeypatch, device, chunk_bytes):
    monkeypatch.setattr(safetensors_stream, "CHUNK_BYTES", chunk_bytes)
    path, tensors = written(tmp_path)
    assert sorted(t.name for t in read_header(path)) == sorted(tensors)
    got, _ = streamed(path, set(tensors), device)
    assert got.keys() == tensors.keys()
    for name, tensor in got.items():
        assert tensor.dtype == tensors[name].dtype and tensor.shape == tensors[name].shape
        assert torch.equal(tensor, tensors[name])


def test_only_the_tensors_asked_for_are_read(tmp_path, monkeypatch):
    monkeypatch.setattr(safetensors_stream, "CHUNK_BYTES", 48)
    x, y, z = torch.arange(10.0), torch.arange(100.0), torch.arange(10.0) + 7
    header = {"x": entry("F32", [10], 0, 40), "y": entry("F32", [100], 40, 440), "z": entry("F32", [10], 440, 480)}
    path = raw_file(tmp_path / "m.safetensors", header, b"".join(t.numpy().tobytes() for t in (x, y, z)))
    got, read = streamed(path, {"x", "z"})
    assert torch.equal(got["x"], x) and torch.equal(got["z"], z)
    assert read == 80  # y's 400 bytes, between them, are skipped


def test_an_empty_tensor_where_another_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(safetensors_stream, "CHUNK_BYTES", 48)
    a = torch.arange(20.0)  # 80 bytes: two chunks
    header = {"a": entry("F32", [20], 0, 80), "e": entry("F32", [0], 0, 0)}  # legal: e has no bytes
    got, _ = streamed(raw_file(tmp_path / "m.safetensors", header, a.numpy().tobytes()), {"a", "e"})
    assert torch.equal(got["a"], a) and got["e"].shape == (0,)
    got, read = streamed(tmp_path / "m.safetensors", {"e"})
    assert got["e"].shape == (0,) and read == 0


@pytest.mark.gpu
@needs_cuda
def test_a_buffer_is_refilled_only_once_its_copies_ran(tmp_path, monkeypatch):
    """One buffer and a GPU held busy: were the next chunk read into the buffer before the copies
    out of it ran, the tensors would get the next chunk's bytes."""
    monkeypatch.setattr(safetensors_stream, "READERS", 1)
    monkeypatch.setattr(safetensors_stream, "CHUNK_BYTES", 1 << 16)
    path, tensors = written(tmp_path)
    torch.cuda._sleep(1 << 28)  # about a tenth of a second of GPU time ahead of the copies
    got, _ = streamed(path, set(tensors), "cuda")
    for name, tensor in got.items():
        assert torch.equal(tensor, tensors[name])


def test_a_file_cut_short_is_named(tmp_path):
    path, _ = written(tmp_path)
    stored = read_header(path)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match="corrupt or cut short"):
        read_header(path)
    with pytest.raises(ValueError, match="cut short"):  # cut after its header was read
        list(stream_tensors(path, stored, torch.device("cpu")))


@pytest.mark.parametrize(
    "header, data, message",
    [
        ({"x": entry("F32", [2], 0, 8), "z": entry("F32", [2], 12, 20)}, 20, "start at 12 .* the file is corrupt"),
        ({"x": entry("F32", [2], 0, 8), "z": entry("F32", [2], 0, 8)}, 8, "start at 0 .* the file is corrupt"),
        ({"x": entry("F32", [2], 0, 8)}, 12, "end at .* the file has"),
        ({"x": entry("F32", [2], -8, 0)}, 8, "entry for x is not"),
        ({"x": {"dtype": "F32", "shape": [2]}}, 8, "entry for x is not"),
        ({"x": entry("F32", [3], 0, 8)}, 8, "do not hold F32 \\[3\\]"),
        ({"x": entry("F4", [2], 0, 1)}, 1, "dtype F4"),
        (["x"], 0, "not a JSON object"),
    ],
    ids=["gap", "overlap", "trailing", "negative", "no-offsets", "wrong-size", "unknown-dtype", "not-an-object"],
)
def test_a_corrupt_header_is_named(tmp_path, header, data, message):
    path = raw_file(tmp_path / "m.safetensors", header, bytes(data))
    with pytest.raises(ValueError, match=message):
        read_header(path)


def test_a_file_that_is_no_safetensors_is_named(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match="not a safetensors file"):
        read_header(path)
    path.write_bytes(b"\x04\x00\x00\x00\x00\x00\x00\x00{no}")
    with pytest.raises(ValueError, match="not JSON"):
        read_header(path)
