"""What the origin refuses of a new request (the rules that span fields; each field's range is
refused when the request is decoded), and the records it writes for the request's n choices."""

import pytest

from actors.lib.origin.intake import choice_records, refusal
from kernel.randomness import SEED_BITS, choice_seed
from schemas.generate import ChatMessage, ChatTemplateArgs, GenerateRequest, SamplingParams, SessionTurn
from schemas.requests import Tenant


@pytest.mark.parametrize(
    ("request_", "param"),
    [
        (GenerateRequest(), "prompt"),
        (GenerateRequest(text="hi", input_ids=[1, 2]), "prompt"),
        (GenerateRequest(text="hi", messages=[ChatMessage("user", "hi")]), "prompt"),
        (GenerateRequest(text="hi", params=SamplingParams(stop=["."], detokenize=False)), "stop"),
        (GenerateRequest(text="hi", n=2, session=SessionTurn("s1")), "n"),
        (GenerateRequest(text="hi", params=SamplingParams(stop_regex=["x"], detokenize=False)), "stop_regex"),
        (GenerateRequest(text="hi", params=SamplingParams(stop_regex=["ok", "(unclosed"])), "stop_regex[1]"),
        (GenerateRequest(text="hi", params=SamplingParams(stop_regex=["a*"])), "stop_regex[0]"),  # matches nothing
        (GenerateRequest(text="hi", n=2, params=SamplingParams(max_tokens=0)), "n"),
        (GenerateRequest(text="hi", session=SessionTurn("s1"), params=SamplingParams(max_tokens=0)), "max_tokens"),
        (GenerateRequest(text="hi", session=SessionTurn("s1"), cache_salt="salt"), "cache_salt"),
        (
            GenerateRequest(text="hi", chat_template=ChatTemplateArgs(kwargs={"enable_thinking": False})),
            "chat_template",
        ),
    ],
)
def test_requests_the_origin_cannot_take_are_refused_naming_the_field(request_, param):
    error = refusal(request_)
    assert (error.code, error.param, error.retriable) == ("invalid_request", param, False)


def test_a_request_it_can_take_is_not_refused():
    assert refusal(GenerateRequest(input_ids=[1, 2], n=3, params=SamplingParams(detokenize=False))) is None
    assert refusal(GenerateRequest(text="hi", session=SessionTurn("s1"), params=SamplingParams(stop=["."]))) is None
    scoring = SamplingParams(max_tokens=0, prompt_logprobs_from=0, stop_regex=[r"\d+"], detokenize=True)
    assert refusal(GenerateRequest(input_ids=[1, 2], params=scoring, cache_salt="salt")) is None


def test_one_choice_is_the_request_itself():
    [record] = choice_records(
        "r", [1, 2], SamplingParams(seed=7, max_tokens=5), n=1, tenant=Tenant("tenant"), created=0.0
    )
    assert (record.request_id, record.prompt_ids, record.tenant, record.fork_of) == (
        "r",
        [1, 2],
        Tenant("tenant"),
        None,
    )
    assert record.params == SamplingParams(seed=7, max_tokens=5)


def test_n_choices_share_the_prompt_with_seeds_of_their_own():
    records = choice_records("r", [1, 2], SamplingParams(seed=7), n=3, tenant=Tenant(), created=0.0)
    assert [r.request_id for r in records] == ["r-0", "r-1", "r-2"]
    assert [r.fork_of for r in records] == [None, "r-0", "r-0"]  # the first computes the prompt
    assert [r.params.seed for r in records] == [7, choice_seed(7, 1), choice_seed(7, 2)]


def test_a_request_without_a_seed_gets_one_so_its_draw_survives_a_restart():
    records = choice_records("r", [1, 2], SamplingParams(), n=2, tenant=Tenant(), created=0.0)
    seed = records[0].params.seed
    assert seed is not None and 0 <= seed < 2**SEED_BITS
    assert records[1].params.seed == choice_seed(seed, 1)
