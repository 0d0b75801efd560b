"""The safetensors stream gives every tensor as safetensors wrote it, whether it lies inside one
chunk or spans several, onto the CPU or a GPU, and names a file that is cut short or not one."""

import pytest
import torch
from safetensors.torch import save_file

from gpu import safetensors_stream
from gpu.safetensors_stream import read_header, stream_tensors

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]),
]


def written(tmp_path):
    generator = torch.Generator().manual_seed(0)
    tensors = {
        "a.weight": torch.randn(7, 13, generator=generator).to(torch.bfloat16),
        "b.scalar": torch.tensor(3.5),
        "c.ids": torch.randint(-5, 5, (40,), generator=generator),
        "d.mask": torch.rand(9, generator=generator) > 0.5,
        "e.empty": torch.zeros(0, 4, dtype=torch.float16),
        "f.big": torch.randn(300, generator=generator),
        "g.last_empty": torch.zeros(0),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, path, metadata={"format": "pt"})
    return path, tensors


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("chunk_bytes", [48, 1000, 1 << 20])  # tensors span chunks; many tensors per chunk; one chunk
def test_every_tensor_arrives_as_written(tmp_path, monkeypatch, device, chunk_bytes):
    monkeypatch.setattr(safetensors_stream, "CHUNK_BYTES", chunk_bytes)
    path, tensors = written(tmp_path)
    stored = read_header(path)
    assert sorted(t.name for t in stored) == sorted(tensors)
    wanted = [t for t in stored if t.name != "c.ids"]  # one left out: its bytes are read past
    read: list[int] = []
    streamed = {s.name: t for s, t in stream_tensors(path, wanted, torch.device(device), read.append)}
    assert list(streamed) == [t.name for t in wanted]
    for name, tensor in streamed.items():
        assert tensor.device.type == device
        assert tensor.dtype == tensors[name].dtype and tensor.shape == tensors[name].shape
        assert torch.equal(tensor.cpu(), tensors[name])
    assert sum(read) == wanted[-1].end - wanted[0].begin


def test_a_file_cut_short_is_named(tmp_path):
    path, _ = written(tmp_path)
    stored = read_header(path)
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(ValueError, match="corrupt or cut short"):
        read_header(path)
    with pytest.raises(ValueError, match="cut short"):  # cut after its header was read
        list(stream_tensors(path, stored, torch.device("cpu")))


def test_a_file_that_is_no_safetensors_is_named(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\xff" * 64)
    with pytest.raises(ValueError, match="not a safetensors file"):
        read_header(path)
    path.write_bytes(b"\x04\x00\x00\x00\x00\x00\x00\x00{no}")
    with pytest.raises(ValueError, match="not JSON"):
        read_header(path)
