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


def test_a_stop_regex_ends_the_text_at_its_first_match_and_names_its_pattern(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    detok = StreamingDetokenizer(tokenizer.backend_tokenizer, [], stop_regex=[r"qu\w+", r"b[aeiou]own"])
    updates = [detok.push([token]) for token in ids]
    stopped_at = next(i for i, u in enumerate(updates) if u.stopped)
    assert "".join(u.text for u in updates[: stopped_at + 1]) == "Hello world, the "
    assert detok.matched_stop == r"qu\w+"
    # the tokens the client gets: up to the one whose text completed the match
    assert tokenizer.decode(ids[: stopped_at + 1]).startswith("Hello world, the qu")
    assert not tokenizer.decode(ids[:stopped_at]).endswith("qu")


@pytest.mark.parametrize(("stop", "stop_regex"), [(["brown"], []), ([], [r"br.wn"])])
def test_include_stop_str_keeps_the_match(tokenizer, stop, stop_regex):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    detok = StreamingDetokenizer(tokenizer.backend_tokenizer, stop, stop_regex=stop_regex, include_stop=True)
    text = "".join(detok.push([token]).text for token in ids if not detok.stopped)
    assert text == "Hello world, the quick brown"
    assert detok.matched_stop == (stop or stop_regex)[0]


def test_a_regex_match_that_begins_in_released_text_cuts_only_what_was_not(tokenizer):
    ids = tokenizer.encode("aaaa bbbb cccc", add_special_tokens=False)
    detok = StreamingDetokenizer(tokenizer.backend_tokenizer, [], stop_regex=[r"a+ b+ c"])
    text = "".join(detok.push([token]).text for token in ids if not detok.stopped)
    assert detok.stopped and "aaaa bbbb".startswith(text)  # what was out stays out; nothing after
