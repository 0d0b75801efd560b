"""Incremental detokenization and stop strings, on a locally trained tokenizer."""

import pytest
from transformers import AutoTokenizer

from actors.tokenizer.detokenizer import StreamingDetokenizer

TEXT = "Hello world, the quick brown fox jumps over the lazy dog. Ünïcode ✓ too: 日本語!"


@pytest.fixture(scope="module")
def tokenizer(build_tiny_model):
    return AutoTokenizer.from_pretrained(build_tiny_model("llama"))


def stream(tokenizer, ids, stop=(), chunk=1):
    detok = StreamingDetokenizer(tokenizer.backend_tokenizer, list(stop))
    pieces, consumed = [], []
    for i in range(0, len(ids), chunk):
        part = ids[i : i + chunk]
        final = i + chunk >= len(ids)
        update = detok.push(part, final=final)
        pieces.append(update.text)
        consumed += update.token_ids
        if update.stopped:
            break
    return "".join(pieces), consumed, detok


@pytest.mark.parametrize("chunk", [1, 3, 100])
def test_streamed_text_equals_whole_decode(tokenizer, chunk):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    text, consumed, _ = stream(tokenizer, ids, chunk=chunk)
    assert text == tokenizer.decode(ids) == TEXT
    assert consumed == ids


@pytest.mark.parametrize("chunk", [1, 4])
def test_stop_string_cuts_text_and_tokens(tokenizer, chunk):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    text, consumed, detok = stream(tokenizer, ids, stop=["fox"], chunk=chunk)
    assert text == "Hello world, the quick brown "
    assert detok.stopped
    assert "fox" in tokenizer.decode(consumed) and len(consumed) < len(ids)
    assert detok.completion_tokens == len(consumed)


def test_text_that_may_start_a_stop_string_is_held_back(tokenizer):
    ids = tokenizer.encode("abc xyz", add_special_tokens=False)
    detok = StreamingDetokenizer(tokenizer.backend_tokenizer, ["xyz!"])
    released = "".join(detok.push([t]).text for t in ids)
    assert released == "abc xyz"[: len("abc xyz") - 3]
    assert detok.push([], final=True).text == "abc xyz"[-3:]


def test_special_tokens_are_skipped(tokenizer):
    eot = tokenizer.convert_tokens_to_ids("<|eot_id|>")
    ids = tokenizer.encode("Done", add_special_tokens=False) + [eot]
    text, consumed, _ = stream(tokenizer, ids)
    assert text == "Done" and consumed == ids
