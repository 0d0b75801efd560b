"""SGLang's native bodies become our requests or a named error, and its replies have SGLang's shape:
`{text, output_ids, meta_info}` with logprob entries `[logprob, token_id, text|null]`."""

import json

import pytest

from actors.frontdoor import sglang_protocol as sglang
from actors.frontdoor.choice_output import ChoiceOutput, LogprobRun
from actors.frontdoor.sglang_protocol import GenerateBatch
from actors.frontdoor.sglang_responses import finish_reason, generate_reply
from actors.frontdoor.sglang_sampling import LogprobAsk
from actors.lib.origin.request_stream import RequestRecord, RequestStream
from schemas.errors import Error
from schemas.generate import SamplingParams, TokenLogprobs
from schemas.requests import RequestOutput


def parse(**fields) -> GenerateBatch | Error:
    return sglang.parse_generate_request(json.dumps(fields).encode())


def assert_invalid(result, param: str, words: str = "") -> None:
    assert isinstance(result, Error), result
    assert (result.code, result.http_status, result.param) == ("invalid_request", 400, param), result
    assert words in result.message, result.message


# --- requests -----------------------------------------------------------------------------------


def test_one_prompt_is_one_item_with_sglangs_defaults():
    batch = parse(text="hi")
    assert batch.single and not batch.stream and len(batch.items) == 1
    (item,) = batch.items
    assert item.request.text == "hi" and item.request.n == 1 and len(item.rid) == 32
    assert item.request.params == SamplingParams(max_tokens=128)  # SGLang's default max_new_tokens
    assert item.logprob == LogprobAsk() and item.max_new_tokens == 128


def test_sampling_params_map_to_ours():
    sampling = {
        "max_new_tokens": 8,
        "min_new_tokens": 2,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 50,
        "min_p": 0.05,
        "stop": "\n",
        "stop_token_ids": [3],
        "stop_regex": "[0-9]+",
        "ignore_eos": True,
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.2,
        "repetition_penalty": 1.1,
        "logit_bias": {"5": -2},
        "sampling_seed": 42,
    }
    (item,) = parse(input_ids=[1, 2, 3], sampling_params=sampling, rid="r1").items
    assert (item.rid, item.request.input_ids, item.request.text) == ("r1", [1, 2, 3], None)
    (floats,) = parse(input_ids=[1.0, 2, 3.0]).items  # JSON's numbers: 1.0 is the id 1
    assert floats.request.input_ids == [1, 2, 3] and all(type(i) is int for i in floats.request.input_ids)
    assert item.request.params == SamplingParams(
        max_tokens=8,
        min_tokens=2,
        temperature=0.7,
        top_p=0.9,
        top_k=50,
        min_p=0.05,
        stop=["\n"],
        stop_token_ids=[3],
        stop_regex=["[0-9]+"],
        ignore_eos=True,
        skip_special_tokens=False,
        include_stop_str_in_output=True,
        presence_penalty=0.1,
        frequency_penalty=0.2,
        repetition_penalty=1.1,
        logit_bias={5: -2.0},
        seed=42,
    )


def test_what_rl_clients_send_is_taken():
    """Explicit nulls, top_k of -1 or 1e8 as "off", keys this server does not use, image_data."""
    sampling = {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "max_new_tokens": 0,
        "stop": None,
        "stop_token_ids": None,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "no_stop_trim": True,
        "json_schema": None,
    }
    batch = parse(input_ids=[1, 2], sampling_params=sampling, image_data=None, return_logprob=True, rid="x")
    params = batch.items[0].request.params
    assert (params.top_k, params.max_tokens, params.stop, params.stop_token_ids) == (0, 0, [], [])
    assert parse(text="a", sampling_params={"top_k": 100000000}).items[0].request.params.top_k == 100000000
    assert parse(text="a", sampling_params={"top_k": 1 << 40}).items[0].request.params.top_k == 0
    assert parse(text="a", sampling_params={"max_new_tokens": None}).items[0].request.params.max_tokens is None


def test_logprob_fields_ask_for_output_and_prompt_logprobs():
    (item,) = parse(
        input_ids=[1, 2, 3, 4],
        return_logprob=True,
        logprob_start_len=0,
        top_logprobs_num=5,
        token_ids_logprob=[7, 8],
        return_text_in_logprobs=True,
    ).items
    assert item.logprob == LogprobAsk(True, 0, 5, [7, 8], True)
    params = item.request.params
    assert (params.logprobs, params.top_logprobs, params.prompt_logprobs_from, params.logprob_token_ids) == (
        True,
        5,
        0,
        [7, 8],
    )
    (default,) = parse(input_ids=[1, 2], return_logprob=True).items
    assert default.logprob.start_len == -1 and default.request.params.prompt_logprobs_from is None
    (off,) = parse(input_ids=[1, 2], top_logprobs_num=5, logprob_start_len=0).items
    assert not off.request.params.logprobs and off.request.params.top_logprobs == 0


def test_a_batch_is_one_item_per_prompt():
    batch = parse(
        text=["a", "b", "c"],
        rid="run",
        sampling_params=[{"max_new_tokens": 1}, {"max_new_tokens": 2}, {"max_new_tokens": 3}],
        return_logprob=[True, False, True],
        token_ids_logprob=[[1], [], [2, 3]],
        stream=True,
    )
    assert not batch.single and batch.stream
    assert [i.rid for i in batch.items] == ["run_0", "run_1", "run_2"]
    assert [i.request.params.max_tokens for i in batch.items] == [1, 2, 3]
    assert [i.logprob.return_logprob for i in batch.items] == [True, False, True]
    assert [i.logprob.token_ids for i in batch.items] == [[1], None, [2, 3]]
    ids = parse(input_ids=[[1, 2], [3]], rid=["p", "q"], sampling_params={"max_new_tokens": 4})
    assert [(i.rid, i.request.input_ids, i.request.params.max_tokens) for i in ids.items] == [
        ("p", [1, 2], 4),
        ("q", [3], 4),
    ]


def test_n_choices_make_a_list_reply():
    batch = parse(text="a", sampling_params={"n": 3})
    assert not batch.single and batch.choices == 3 and batch.items[0].request.n == 3


def test_session_params_continue_a_session():
    (item,) = parse(text="more", session_params={"id": "s1", "rid": "t0", "replace": True}).items
    assert (item.request.session.session_id, item.request.session.parent_turn, item.request.session.replace) == (
        "s1",
        "t0",
        True,
    )


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({}, "text", "exactly one"),
        ({"text": "a", "input_ids": [1]}, "text", "exactly one"),
        ({"text": ""}, "text", "length >= 1"),
        ({"text": []}, "text", "length >= 1"),
        ({"input_ids": []}, "input_ids", "length >= 1"),
        ({"input_ids": [[1], []]}, "input_ids", "empty"),
        ({"input_ids": [1, -2]}, "input_ids[0][1]", "token ids"),
        ({"input_ids": [1, "a"]}, "input_ids[0][1]", "token ids"),
        ({"input_ids": [1, 2.5]}, "input_ids[0][1]", "token ids"),
        ({"input_ids": [1.0, -2.0]}, "input_ids[0][1]", "token ids"),
        ({"text": 5}, "text", "Expected"),
        ({"text": "a", "top_logprobs_num": 21}, "top_logprobs_num", "<= 20"),
        ({"input_ids": [1, 2], "return_logprob": True, "logprob_start_len": 2}, "logprob_start_len", "past"),
        ({"text": "a", "logprob_start_len": -2}, "logprob_start_len", ">= -1"),
        ({"text": ["a", "b"], "rid": ["x"]}, "rid", "2"),
        ({"text": ["a", "b"], "rid": ["x", "x"]}, "rid", "differ"),
        ({"text": ["a", "b"], "sampling_params": [{}]}, "sampling_params", "batch of 2"),
        ({"text": ["a", "b"], "sampling_params": [{"n": 2}, {}]}, "sampling_params.n", "same n"),
        ({"text": "a", "sampling_params": {"temperature": 3}}, "sampling_params.temperature", "<= 2.0"),
        ({"text": "a", "sampling_params": {"max_new_tokens": -1}}, "sampling_params.max_new_tokens", ">= 0"),
        ({"text": "a", "sampling_params": {"logit_bias": {"a": 1}}}, "sampling_params.logit_bias", "matching regex"),
        ({"text": "a", "sampling_params": {"stop_regex": "("}}, "sampling_params.stop_regex", "regular expression"),
        ({"text": "a", "sampling_params": {"allowed_token_ids": []}}, "sampling_params.allowed_token_ids", ">= 1"),
        ({"text": "a", "sampling_params": {"structural_tag": "{}"}}, "sampling_params.structural_tag", "not supported"),
        (
            {"text": "a", "sampling_params": {"regex": "a", "ebnf": 'root ::= "a"'}},
            "sampling_params.ebnf",
            "not several",
        ),
        ({"text": "a", "token_ids_logprob": [-1]}, "token_ids_logprob", "token ids"),
        ({"text": ["a", "b"], "session_params": {"id": "s"}}, "session_params", "batch"),
        ({"text": "a", "session_params": {"id": "s", "offset": 3}}, "session_params.offset", "not supported"),
        ({"text": "a", "lora_path": "/adapters/a"}, "lora_path", "LoRA"),
        ({"text": "a", "image_data": ["x.png"]}, "image_data", "null"),
        (
            {"text": "a", "sampling_params": {"spaces_between_special_tokens": True}},
            "sampling_params.spaces_between_special_tokens",
            "",
        ),
        ({"text": "a", "sampling_params": {"min_tokens": 3}}, "sampling_params.min_tokens", "no such field"),
    ],
)
def test_bad_bodies_name_the_field(fields, param, words):
    assert_invalid(parse(**fields), param, words)


def test_abort_bodies():
    assert sglang.parse_abort_request(b'{"abort_all": true}').abort_all
    body = sglang.parse_abort_request(b'{"rid": "", "abort_all": true}')
    assert (body.rid, body.abort_all) == ("", True)
    assert sglang.parse_abort_request(b'{"rid": "r1"}').rid == "r1"
    assert sglang.parse_abort_request(b"").rid == ""
    assert_invalid(sglang.parse_abort_request(b'{"abort_all": "yes"}'), "abort_all")


# --- replies ------------------------------------------------------------------------------------


def delivered(*outputs: RequestOutput) -> ChoiceOutput:
    """A choice that read `outputs` as the origin delivered them (its record books their versions)."""
    stream = RequestStream(RequestRecord("r", [1], SamplingParams()), 60.0, on_close=None)
    choice = ChoiceOutput(stream.record)
    for output in outputs:
        stream.deliver(output)
        choice.add(output)
    return choice


TEXTS = {5: "a", 6: "b", 9: "z", 1: "<s>", 2: "x", 3: "y"}


def test_reply_without_logprobs():
    choice = delivered(
        RequestOutput("r", [5], "a", None, 1, cached_tokens=2),
        RequestOutput("r", [6], "b", "stop", 2, output_index=1, matched_stop=6),
    )
    reply = generate_reply("r", choice, [1, 2, 3], LogprobRun(), TEXTS, 2, LogprobAsk(), 8)
    assert reply == {
        "text": "ab",
        "output_ids": [5, 6],
        "meta_info": {
            "id": "r",
            "finish_reason": {"type": "stop", "matched": 6},
            "prompt_tokens": 3,
            "weight_version": "default",
            "completion_tokens": 2,
            "cached_tokens": 2,
            "weight_versions": [{"version": "default", "start": 0, "end": 2}],
            "version_spans": [[0, "default"]],
        },
    }


def test_versions_say_which_weights_computed_each_token():
    """Tokens drawn before an update under "default", after it under "7": the spans split exactly
    there, SGLang's `{version, start, end}` and the bus's `[first index, version]` alike."""
    choice = delivered(
        RequestOutput("r", [5, 6], "ab", None, 2),
        RequestOutput("r", [9], "z", None, 3, output_index=2, weight_version="default"),
        RequestOutput("r", [2, 3], "xy", None, 5, output_index=3, weight_version="7"),
        RequestOutput("r", [], "", "length", 5, output_index=5, weight_version="7"),
    )
    meta = generate_reply("r", choice, [1], LogprobRun(), TEXTS, 0, LogprobAsk(), 5)["meta_info"]
    assert meta["weight_version"] == "7"
    assert meta["weight_versions"] == [
        {"version": "default", "start": 0, "end": 3},
        {"version": "7", "start": 3, "end": 5},
    ]
    assert meta["version_spans"] == [[0, "default"], [3, "7"]]
    # An incremental event carries the new tokens, and the spans of the whole output.
    event = generate_reply("r", choice, [1], LogprobRun(), TEXTS, 0, LogprobAsk(), 5, since=(4, 4))
    assert event["output_ids"] == [3] and event["meta_info"]["version_spans"] == [[0, "default"], [3, "7"]]


def test_an_event_names_the_versions_of_its_own_tokens_while_the_record_runs_ahead():
    """The origin books the versions as outputs arrive; a stream event built before its reader
    caught up shows only the tokens it carries, and the weights that computed those."""
    early = RequestOutput("r", [5, 6], "ab", None, 2)
    choice = delivered(early, RequestOutput("r", [9], "z", None, 3, output_index=2, weight_version="7"))
    behind = ChoiceOutput(choice.record)
    behind.add(early)
    meta = generate_reply("r", behind, [1], LogprobRun(), TEXTS, 0, LogprobAsk(), 5)["meta_info"]
    assert (meta["weight_version"], meta["version_spans"]) == ("default", [[0, "default"]])
    assert meta["weight_versions"] == [{"version": "default", "start": 0, "end": 2}]


def test_a_reply_without_tokens_names_the_version_that_served_it():
    choice = delivered(RequestOutput("r", [], "", "length", 0, weight_version="3"))
    meta = generate_reply("r", choice, [1, 2], LogprobRun(), TEXTS, 0, LogprobAsk(), 0)["meta_info"]
    assert meta["weight_version"] == "3"
    assert meta["weight_versions"] == [{"version": "3", "start": 0, "end": 0}]


def test_finish_reasons_in_sglangs_shape():
    assert finish_reason(delivered(RequestOutput("r", [], "", "length", 4)), 4) == {"type": "length", "length": 4}
    assert finish_reason(delivered(RequestOutput("r", [], "", "abort", 0)), 4)["type"] == "abort"
    assert finish_reason(delivered(RequestOutput("r", [5], "a", None, 1)), 4) is None
    stop = delivered(RequestOutput("r", [], "", "stop", 0, matched_stop="\n\n"))
    assert finish_reason(stop, 4) == {"type": "stop", "matched": "\n\n"}


def logprob_output() -> ChoiceOutput:
    return delivered(
        RequestOutput(
            "r",
            [5, 6],
            "ab",
            "length",
            2,
            logprobs=TokenLogprobs(0, [-0.5, -1.5], [[5, 9], [9, 6]], [[-0.5, -2.0], [-0.25, -1.5]], [[-3.0], [-4.0]]),
            prompt_logprobs=TokenLogprobs(
                1, [-1.0, -2.0], [[2, 9], [9, 3]], [[-1.0, -3.0], [-0.5, -2.0]], [[-5.0]] * 2
            ),
            token_texts=TEXTS,
        )
    )


def test_logprobs_from_the_prompts_start():
    choice = logprob_output()
    ask = LogprobAsk(True, 0, 2, [9], True)
    meta = generate_reply("r", choice, [1, 2, 3], choice.prompt_logprobs, TEXTS, 0, ask, 2)["meta_info"]
    assert meta["input_token_logprobs"] == [[None, 1, "<s>"], [-1.0, 2, "x"], [-2.0, 3, "y"]]
    assert meta["output_token_logprobs"] == [[-0.5, 5, "a"], [-1.5, 6, "b"]]
    assert meta["input_top_logprobs"] == [None, [[-1.0, 2, "x"], [-3.0, 9, "z"]], [[-0.5, 9, "z"], [-2.0, 3, "y"]]]
    assert meta["output_top_logprobs"] == [[[-0.5, 5, "a"], [-2.0, 9, "z"]], [[-0.25, 9, "z"], [-1.5, 6, "b"]]]
    assert meta["input_token_ids_logprobs"] == [None, [[-5.0, 9, "z"]], [[-5.0, 9, "z"]]]
    assert meta["output_token_ids_logprobs"] == [[[-3.0, 9, "z"]], [[-4.0, 9, "z"]]]


def test_logprobs_by_default_cover_the_output_and_no_text():
    choice = logprob_output()
    meta = generate_reply("r", choice, [1, 2, 3], LogprobRun(), TEXTS, 0, LogprobAsk(True), 2)["meta_info"]
    # SGLang's default (-1) reports the prompt's last position, without a logprob.
    assert meta["input_token_logprobs"] == [[None, 3, None]]
    assert meta["output_token_logprobs"] == [[-0.5, 5, None], [-1.5, 6, None]]
    assert "output_top_logprobs" not in meta and "input_token_ids_logprobs" not in meta
    scoring = generate_reply("r", delivered(), [1, 2, 3], LogprobRun(), TEXTS, 0, LogprobAsk(True), 0)
    assert scoring["meta_info"]["input_token_logprobs"] == [] and scoring["output_ids"] == []


def test_logprobs_from_a_later_start():
    choice = logprob_output()
    ask = LogprobAsk(True, 2, 1)
    meta = generate_reply("r", choice, [1, 2, 3], choice.prompt_logprobs, TEXTS, 0, ask, 2)["meta_info"]
    assert meta["input_token_logprobs"] == [[-2.0, 3, None]]
    assert meta["input_top_logprobs"] == [[[-0.5, 9, None]]]


def test_a_repeated_part_is_not_joined_twice():
    run = LogprobRun()
    run.extend(TokenLogprobs(0, [-1.0]))
    run.extend(TokenLogprobs(0, [-1.0]))
    run.extend(TokenLogprobs(1, [-2.0]))
    assert (run.start, run.logprobs, run.end) == (0, [-1.0, -2.0], 2)


def test_an_incremental_event_carries_only_what_came_after_the_last():
    choice = logprob_output()
    ask = LogprobAsk(True, 0, 1)
    later = generate_reply("r", choice, [1, 2, 3], choice.prompt_logprobs, TEXTS, 0, ask, 2, since=(1, 1))
    assert (later["text"], later["output_ids"]) == ("b", [6])
    meta = later["meta_info"]
    assert meta["output_token_logprobs"] == [[-1.5, 6, None]] and meta["output_top_logprobs"] == [[[-0.25, 9, None]]]
    assert meta["input_token_logprobs"] == [] and meta["completion_tokens"] == 2  # the prompt's came first
    first = generate_reply("r", choice, [1, 2, 3], choice.prompt_logprobs, TEXTS, 0, ask, 2, since=(0, 0))
    assert first["output_ids"] == [5, 6] and len(first["meta_info"]["input_token_logprobs"]) == 3
