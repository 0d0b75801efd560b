"""Block hashes name KV across processes and machines: chained over every token before a block,
scoped by a namespace of what else the KV depends on, and fixed byte for byte (the disk tier's
files outlive the process that named them)."""

import hashlib
import os
import struct
import subprocess
import sys

import pytest

from actors.lib.block_hashes import block_hashes, extend_hashes, namespace_key, root_hash

NS = namespace_key("weights-sha", "tokenizer-sha", "bfloat16", 4, "layout-1")
TOKENS = list(range(100, 112))  # three blocks of 4


def test_a_block_hash_covers_every_token_before_it():
    hashes = block_hashes(TOKENS, 4, NS)
    assert len(hashes) == 3 and all(len(h) == 16 for h in hashes) and len(set(hashes)) == 3
    first_changed = block_hashes([7] + TOKENS[1:], 4, NS)
    assert all(a != b for a, b in zip(hashes, first_changed))  # one token moves every later block
    last_changed = block_hashes(TOKENS[:-1] + [7], 4, NS)
    assert last_changed[:2] == hashes[:2] and last_changed[2] != hashes[2]


def test_a_prefix_has_the_hashes_of_its_whole_blocks_and_a_chain_extends_from_its_last_hash():
    hashes = block_hashes(TOKENS, 4, NS)
    assert block_hashes(TOKENS[:10], 4, NS) == hashes[:2]  # the partial third block has no hash
    assert extend_hashes(hashes[0], TOKENS[4:], 4) == hashes[1:]
    assert block_hashes(TOKENS, 4, NS)[0] == extend_hashes(root_hash(NS), TOKENS[:4], 4)[0]


def test_the_hashes_are_blake2b_of_the_parent_and_little_endian_uint32_tokens():
    """The format, spelled out: a file written on one machine is found on any other."""
    parent = hashlib.blake2b(NS.encode(), digest_size=16).digest()
    expected = []
    for start in range(0, 12, 4):
        parent = hashlib.blake2b(parent + struct.pack("<4I", *TOKENS[start : start + 4]), digest_size=16).digest()
        expected.append(parent)
    assert block_hashes(TOKENS, 4, NS) == expected
    # Pinned: a change to what goes into a namespace would strand every file on disk unnoticed.
    assert namespace_key("w", "t", "bfloat16", 16, "v1") == "539d25ea2d6bb86fb9ee6584bccd51fc"


def test_hashes_are_the_same_in_another_process_with_another_hash_seed():
    code = (
        "from actors.lib.block_hashes import block_hashes, namespace_key;"
        "ns = namespace_key('weights-sha', 'tokenizer-sha', 'bfloat16', 4, 'layout-1');"
        "print(ns, block_hashes(list(range(100, 112)), 4, ns)[-1].hex())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    printed = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert printed.stdout.split() == [NS, block_hashes(TOKENS, 4, NS)[-1].hex()]


def test_every_field_of_the_namespace_scopes_the_hashes():
    fields = ("weights-sha", "tokenizer-sha", "bfloat16", 4, "layout-1")
    keys = {namespace_key(*fields)}
    for i, other in enumerate(("weights-2", "tokenizer-2", "float8_e4m3fn", 8, "layout-2")):
        keys.add(namespace_key(*fields[:i], other, *fields[i + 1 :]))
    assert len(keys) == 6 and all(len(k) == 32 and int(k, 16) >= 0 for k in keys)
    other = namespace_key("weights-2", *fields[1:])
    assert set(block_hashes(TOKENS, 4, NS)).isdisjoint(block_hashes(TOKENS, 4, other))


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: namespace_key("", "t", "bfloat16", 4, "v1"), "weights"),
        (lambda: namespace_key("w", "t", "bfloat16", 0, "v1"), "block_size"),
        (lambda: block_hashes([1, -2, 3, 4], 4, NS), "token_ids"),
        (lambda: block_hashes([1, 2], 0, NS), "block_size"),
        (lambda: extend_hashes(b"short", [1, 2, 3, 4], 4), "parent"),
    ],
)
def test_bad_input_is_refused_naming_the_field(call, field):
    with pytest.raises(ValueError, match=field):
        call()
