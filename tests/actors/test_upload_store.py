"""Bus uploads staged on disk: chunks land in their place in a safetensors file that loads as the
tensors sent, a tensor is checked against the trainer's checksum once whole, what arrived survives
a restart of the store, and bad chunks or manifests are refused naming the field."""

import torch
from safetensors.torch import load_file

from actors.weight_sync.upload_store import UploadStore
from gpu.weight_check import checksum
from schemas.admin_weights import BeginBusUpload, TensorManifest, UploadChunk
from schemas.errors import Error

CHUNK = 64
TENSORS = {
    "a.weight": torch.arange(40, dtype=torch.float32).reshape(4, 10),  # 160 bytes: 3 chunks
    "b.weight": torch.ones(3, 2, dtype=torch.bfloat16),  # 12 bytes: 1 chunk
    "empty": torch.zeros(0, 4),
}


def manifest(upload_id: str = "u1", chunk_bytes: int = CHUNK) -> BeginBusUpload:
    entries = [
        TensorManifest(n, str(t.dtype).removeprefix("torch."), list(t.shape), checksum(t)) for n, t in TENSORS.items()
    ]
    return BeginBusUpload(upload_id, entries, chunk_bytes)


def chunk(index: int, number: int, upload_id: str = "u1") -> UploadChunk:
    data = list(TENSORS.values())[index].contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return UploadChunk(upload_id, index, number, data[number * CHUNK : (number + 1) * CHUNK])


def test_a_complete_upload_is_a_checkpoint_of_the_tensors_sent(tmp_path):
    store = UploadStore(tmp_path, 1024)
    assert store.begin(manifest()).missing == {0: [0, 1, 2], 1: [0]}  # the empty tensor is whole already
    assert store.write(chunk(0, 2)).missing == {0: [0, 1]}
    assert store.write(chunk(1, 0)).missing == {1: []}  # whole and checked
    assert isinstance(store.checkpoint("u1"), Error)
    store.write(chunk(0, 0))
    store.write(chunk(0, 1))
    folder = store.checkpoint("u1")
    loaded = load_file(folder / "model.safetensors")
    assert loaded.keys() == TENSORS.keys() and all(torch.equal(loaded[n], t) for n, t in TENSORS.items())
    store.remove("u1")
    assert not folder.exists()


def test_a_tensor_that_fails_its_checksum_is_missing_whole_again(tmp_path):
    store = UploadStore(tmp_path, 1024)
    store.begin(manifest())
    bad = chunk(0, 1)
    store.write(chunk(0, 0))
    store.write(UploadChunk("u1", 0, 1, bytes(len(bad.data))))
    assert store.write(chunk(0, 2)).missing == {0: [0, 1, 2]}
    for number in range(3):
        store.write(chunk(0, number))
    assert store.begin(manifest()).missing == {1: [0]}


def test_what_arrived_survives_a_restart(tmp_path):
    store = UploadStore(tmp_path, 1024)
    store.begin(manifest())
    store.write(chunk(0, 0))
    store.write(chunk(1, 0))
    again = UploadStore(tmp_path, 1024)
    assert again.begin(manifest()).missing == {0: [1, 2]}
    again.write(chunk(0, 1))
    again.write(chunk(0, 2))
    assert not isinstance(again.checkpoint("u1"), Error)


def test_bad_requests_name_their_field(tmp_path):
    store = UploadStore(tmp_path, 1024)
    assert store.begin(manifest(upload_id="../x")).param == "upload_id"
    assert store.begin(manifest(chunk_bytes=4096)).param == "chunk_bytes"
    odd = BeginBusUpload("u2", [TensorManifest("x", "complex32", [2], "0")], CHUNK)
    assert store.begin(odd).param == "tensors[0].dtype"
    store.begin(manifest())
    assert store.begin(manifest(chunk_bytes=32)).param == "upload_id"  # another manifest under the same id
    assert store.write(UploadChunk("nope", 0, 0, b"")).code == "not_found"
    assert store.write(UploadChunk("u1", 7, 0, b"")).param == "tensor"
    assert store.write(UploadChunk("u1", 0, 3, b"")).param == "chunk"
    assert store.write(UploadChunk("u1", 0, 2, b"x")).param == "data"
