"""The weights' fingerprint names the checkpoint by its bytes: the same files elsewhere, at other
times, name the same weights (servers on several machines share KV chains); one changed byte names
others. Digests are remembered by path, size, times and inode, so a restart reads no weights, and a
file rewritten in place is read again."""

import os
import shutil

from actors.lib import weights_fingerprint as weights_fingerprint_module
from actors.lib.weights_fingerprint import CACHE_FILE, weights_fingerprint


def make_checkpoint(directory, weights=b"\x01\x02" * 5000):
    directory.mkdir(parents=True)
    (directory / "model.safetensors").write_bytes(weights)
    (directory / "config.json").write_text('{"hidden_size": 8}')
    return directory


def test_the_same_bytes_elsewhere_and_later_name_the_same_weights(tmp_path):
    first = make_checkpoint(tmp_path / "here")
    elsewhere = tmp_path / "there" / "copy"
    shutil.copytree(first, elsewhere, copy_function=shutil.copyfile)  # new files, new times
    os.utime(elsewhere / "model.safetensors", ns=(1, 1))
    assert weights_fingerprint(str(first), "bfloat16") == weights_fingerprint(str(elsewhere), "bfloat16")
    assert weights_fingerprint(str(first), "bfloat16") != weights_fingerprint(str(first), "float32")


def test_one_changed_byte_or_file_name_names_other_weights(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "ckpt")
    before = weights_fingerprint(str(checkpoint), "bfloat16", tmp_path / "data")
    weights = bytearray((checkpoint / "model.safetensors").read_bytes())
    weights[7777] ^= 1
    (checkpoint / "model.safetensors").write_bytes(bytes(weights))
    assert weights_fingerprint(str(checkpoint), "bfloat16", tmp_path / "data") != before
    (checkpoint / "model.safetensors").rename(checkpoint / "other.safetensors")
    assert weights_fingerprint(str(checkpoint), "bfloat16") != weights_fingerprint(str(checkpoint), "float16")


def test_a_restart_takes_the_remembered_digest_of_an_unchanged_file(tmp_path, monkeypatch):
    checkpoint = make_checkpoint(tmp_path / "ckpt")
    data_dir = tmp_path / "data"
    first = weights_fingerprint(str(checkpoint), "bfloat16", data_dir)
    assert (data_dir / CACHE_FILE).exists()

    def read_again(path):
        raise AssertionError(f"{path} was hashed again")

    monkeypatch.setattr(weights_fingerprint_module, "_hash_file", read_again)
    assert weights_fingerprint(str(checkpoint), "bfloat16", data_dir) == first


def test_a_file_rewritten_in_place_with_its_size_and_time_is_hashed_again(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "ckpt")
    data_dir = tmp_path / "data"
    first = weights_fingerprint(str(checkpoint), "bfloat16", data_dir)
    weights = checkpoint / "model.safetensors"
    stat = weights.stat()
    weights.write_bytes(b"\x09" * stat.st_size)  # a fine-tune of the same shape, its time put back
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert weights_fingerprint(str(checkpoint), "bfloat16", data_dir) != first


def test_hidden_files_are_not_part_of_the_weights(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "ckpt")
    before = weights_fingerprint(str(checkpoint), "bfloat16")
    metadata = checkpoint / ".cache" / "huggingface" / "download" / "model.safetensors.metadata"
    metadata.parent.mkdir(parents=True)
    metadata.write_text("etag\n1764201600.123\n")  # a download's own record, its time in it
    assert weights_fingerprint(str(checkpoint), "bfloat16") == before


def test_a_damaged_digest_cache_costs_a_hash_not_the_name(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "ckpt")
    data_dir = tmp_path / "data"
    first = weights_fingerprint(str(checkpoint), "bfloat16", data_dir)
    (data_dir / CACHE_FILE).write_bytes(b"\xc1not msgpack")
    assert weights_fingerprint(str(checkpoint), "bfloat16", data_dir) == first
    assert weights_fingerprint(str(checkpoint), "bfloat16", data_dir) == first  # the cache written again
