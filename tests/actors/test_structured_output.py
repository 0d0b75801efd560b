"""Structured output through the in-process engine (the scheduler's batcher and the executor's batch,
no bus) on random-weight models: whatever the model draws, a constrained output is a sentence of its
grammar, constrained and free requests share the batch without touching each other, a resumed run
replays its outputs into the grammar, and a grammar's failure ends its own request alone.
"""

import json
import re
from concurrent.futures import Future
from typing import Literal

import msgspec
import pytest
from pydantic import BaseModel, Field
from transformers import AutoTokenizer

from actors.executor.grammars import Grammars
from actors.executor.running_batch import RunningBatch
from actors.frontdoor.structured_output import choice_grammar
from actors.inprocess import InProcessEngine
from gpu.runner import ModelRunner
from schemas.generate import Constraint, SamplingParams
from schemas.step import PrefillChunk, StartSequence


class Pet(BaseModel):
    kind: Literal["cat", "dog", "fish"]
    age: int = Field(ge=0, le=30)
    name: str = Field(max_length=12)


class Person(BaseModel):
    """Every string and list bounded, so a sentence always fits in the token budget."""

    name: str = Field(max_length=16)
    happy: bool
    pets: list[Pet] = Field(max_length=3)
    nickname: str | None = Field(max_length=8)


PERSON = Constraint("json_schema", json.dumps(Person.model_json_schema()))
MAX_TOKENS = 400


def constrained(constraint: Constraint, seed: int, max_tokens: int = MAX_TOKENS, **more) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=seed, constraint=constraint, **more)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model_dir(request, build_tiny_model):
    return build_tiny_model(request.param)


@pytest.fixture(scope="module")
def llama_dir(build_tiny_model):
    return build_tiny_model("llama")


def new_engine(
    model_dir, grammars: bool = True, num_kv_blocks: int = 2048, fill_threads: int | None = None
) -> InProcessEngine:
    runner = ModelRunner(model_dir, device="cpu", num_kv_blocks=num_kv_blocks, block_size=16)
    found = (
        Grammars(model_dir, runner.vocab_size, runner.eos_token_ids, fill_threads=fill_threads) if grammars else None
    )
    return InProcessEngine(runner, max_num_seqs=256, max_prefill_tokens=4096, grammars=found)


def prompt(i: int) -> list[int]:
    return [(37 * i + 11 * k) % 900 + 5 for k in range(3 + i % 7)]


def test_every_constrained_output_parses_and_validates_beside_free_requests(model_dir):
    """200 requests with a JSON schema and 20 without, in one batch: each constrained output is JSON
    that the schema's own pydantic model accepts; each ends because its grammar ended. The masks are
    filled on 2 threads, as on a machine of 4 cores or more."""
    engine = new_engine(model_dir, fill_threads=2)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    for i in range(200):
        engine.submit(f"json-{i}", prompt(i), constrained(PERSON, seed=i))
    for i in range(20):
        engine.submit(f"free-{i}", prompt(i), SamplingParams(max_tokens=30, temperature=1.0, seed=i, ignore_eos=True))
    engine.run()
    for i in range(200):
        text = tokenizer.decode(engine.outputs[f"json-{i}"], skip_special_tokens=True)
        Person.model_validate_json(text)  # raises on anything the schema does not allow
        assert engine.finish_reasons[f"json-{i}"] == "stop", text
    assert all(len(engine.outputs[f"free-{i}"]) == 30 for i in range(20))


def test_a_free_request_draws_the_same_tokens_beside_constrained_ones(llama_dir):
    engine = new_engine(llama_dir)
    engine.submit("free", prompt(3), SamplingParams(max_tokens=40, temperature=1.0, seed=7))
    engine.run()
    alone = engine.outputs["free"]
    engine = new_engine(llama_dir)
    for i in range(16):
        engine.submit(f"json-{i}", prompt(i), constrained(PERSON, seed=i))
    engine.submit("free", prompt(3), SamplingParams(max_tokens=40, temperature=1.0, seed=7))
    engine.run()
    assert engine.outputs["free"] == alone


@pytest.mark.parametrize(
    ("constraint", "matches"),
    [
        (Constraint("regex", r"[a-z]{2,6}@[a-z]{2,5}\.(com|org)"), r"[a-z]{2,6}@[a-z]{2,5}\.(com|org)"),
        (Constraint("regex", r"-?(0|[1-9][0-9]{0,4})"), r"-?(0|[1-9][0-9]{0,4})"),
        (
            Constraint("grammar", 'root ::= item (", " item){0,3}\nitem ::= ("red" | "green" | "blue") " " [0-9]'),
            r"(red|green|blue) [0-9](, (red|green|blue) [0-9]){0,3}",
        ),
        (Constraint("grammar", 'start: "yes" | "no" | "maybe"'), "yes|no|maybe"),  # Lark's notation
        (Constraint("grammar", choice_grammar(['say "hi"', "a\\b", "ünï"])), r'say "hi"|a\\b|ünï'),
    ],
)
def test_regex_and_grammar_outputs_are_sentences_of_them(llama_dir, constraint, matches):
    engine = new_engine(llama_dir)
    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    for i in range(24):
        engine.submit(f"r{i}", prompt(i), constrained(constraint, seed=i))
    engine.run()
    for i in range(24):
        text = tokenizer.decode(engine.outputs[f"r{i}"], skip_special_tokens=True)
        assert re.fullmatch(matches, text), text
        assert engine.finish_reasons[f"r{i}"] == "stop"


def test_json_object_outputs_that_end_are_json_objects(llama_dir):
    """Any JSON object may hold strings of any length, which a random model need not end within its
    tokens: those that end must be objects."""
    engine = new_engine(llama_dir)
    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    for i in range(24):
        engine.submit(f"r{i}", prompt(i), constrained(Constraint("json_object"), seed=i, max_tokens=600))
    engine.run()
    ended = [i for i in range(24) if engine.finish_reasons[f"r{i}"] == "stop"]
    assert len(ended) >= 4
    for i in ended:
        assert isinstance(json.loads(tokenizer.decode(engine.outputs[f"r{i}"], skip_special_tokens=True)), dict)


def test_a_resumed_run_replays_its_outputs_into_the_grammar(llama_dir):
    """A request resubmitted with the outputs its client has (a migration, or the scheduler's
    recompute after a preemption) masks its next draws as the first run did, so its seeded draw
    continues with the very same tokens."""
    engine = new_engine(llama_dir)
    engine.submit("r", prompt(1), constrained(PERSON, seed=5))
    engine.run()
    whole = engine.outputs["r"]
    assert len(whole) > 12
    for cut in (1, len(whole) // 2, len(whole) - 1):
        engine = new_engine(llama_dir)
        engine.submit("r", prompt(1), constrained(PERSON, seed=5), output_ids=whole[:cut])
        engine.run()
        assert whole[:cut] + engine.outputs["r"] == whole
        assert engine.finish_reasons["r"] == "stop"


def test_preempted_constrained_requests_still_parse(llama_dir):
    """A KV pool too small for the batch preempts requests midway; each comes back and replays."""
    engine = new_engine(llama_dir, num_kv_blocks=40)
    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    for i in range(24):
        engine.submit(f"r{i}", prompt(i), constrained(PERSON, seed=i))
    engine.run()
    assert engine.batcher.preemptions > 0
    for i in range(24):
        Person.model_validate_json(tokenizer.decode(engine.outputs[f"r{i}"], skip_special_tokens=True))


def test_a_finished_grammar_ends_the_request_even_with_ignore_eos(llama_dir):
    engine = new_engine(llama_dir)
    engine.submit("r", prompt(2), constrained(Constraint("regex", "ab"), seed=1, max_tokens=50, ignore_eos=True))
    engine.run()
    tokenizer = AutoTokenizer.from_pretrained(llama_dir)
    assert tokenizer.decode(engine.outputs["r"], skip_special_tokens=True) == "ab"
    assert engine.finish_reasons["r"] == "stop"


def test_logprobs_of_a_constrained_draw_are_of_the_tokens_the_grammar_allows(llama_dir):
    """Only one token may start "q": its logprob in the distribution renormalized over the allowed
    tokens is 0, as vLLM reports it; its logprob of the raw logits would be far below."""
    engine = new_engine(llama_dir)
    engine.submit("r", prompt(4), constrained(Constraint("regex", "q"), seed=3, max_tokens=5, logprobs=True))
    updates = []
    while engine.busy:
        updates += [u for u in engine.step().updates if u.request_id == "r" and u.token_ids]
    first = updates[0]
    assert AutoTokenizer.from_pretrained(llama_dir).decode(first.token_ids) == "q"
    assert first.logprobs.logprobs[0] == pytest.approx(0.0, abs=1e-5)


def test_without_a_tokenizer_a_constrained_request_fails_and_the_rest_run(llama_dir):
    engine = new_engine(llama_dir, grammars=False)
    engine.submit("json", prompt(1), constrained(PERSON, seed=1))
    engine.submit("free", prompt(2), SamplingParams(max_tokens=8, temperature=1.0, seed=2))
    failed = []
    while engine.busy:
        failed += [u for u in engine.step().updates if u.finish_reason == "error"]
    assert [u.request_id for u in failed] == ["json"]
    assert "no tokenizer" in failed[0].error.message and failed[0].error.param == "params.constraint"
    assert len(engine.outputs["free"]) == 8


def test_a_constraint_that_allows_no_token_fails_as_the_clients_doing(llama_dir):
    """An empty character class parses but allows nothing: a 400 for its request, not the batch's end."""
    engine = new_engine(llama_dir)
    nothing = Constraint("regex", "[^\\x00-\\U0010FFFF]", param="guided_regex")
    engine.submit("empty", prompt(1), constrained(nothing, seed=1))
    engine.submit("free", prompt(2), SamplingParams(max_tokens=8, temperature=1.0, seed=2, ignore_eos=True))
    failed = []
    while engine.busy:
        failed += [u for u in engine.step().updates if u.finish_reason == "error"]
    assert [(u.request_id, u.error.code, u.error.param) for u in failed] == [
        ("empty", "invalid_request", "guided_regex")
    ]
    assert "allows no token" in failed[0].error.message and engine.outputs["empty"] == []
    assert len(engine.outputs["free"]) == 8


def start(request_id: str, params: SamplingParams, prompt_ids: list[int], first_block: int = 0) -> list:
    """The commands that start a sequence in blocks of 4 tokens from `first_block` on."""
    blocks = list(range(first_block, first_block + len(prompt_ids) // 4 + 2))
    return [StartSequence(request_id, params, blocks), PrefillChunk(request_id, prompt_ids, 0, last=True)]


def new_batch(model_dir) -> tuple[RunningBatch, Grammars]:
    runner = ModelRunner(model_dir, device="cpu", num_kv_blocks=64, block_size=4)
    grammars = Grammars(model_dir, runner.vocab_size, runner.eos_token_ids)
    return RunningBatch(4, 256, runner.eos_token_ids, runner.vocab_size, grammars), grammars


def test_a_token_the_grammar_refuses_fails_its_request_alone(llama_dir):
    """A drawn token the grammar does not allow is a bug (the mask allows only what it accepts): the
    request fails with an Error naming its constraint, and the batch goes on."""
    batch, grammars = new_batch(llama_dir)
    digits = Constraint("regex", "[0-9]+", param="response_format")
    grammars.compile(digits).result()
    for command in start("a", constrained(digits, seed=1), [5, 6, 7]) + start("b", SamplingParams(), [8, 9], 10):
        batch.apply(command)
    _, plan = batch.plan_step(64)
    letter = AutoTokenizer.from_pretrained(llama_dir).convert_tokens_to_ids("x")
    updates = batch.book(plan, [letter, letter])
    by_id = {u.request_id: u for u in updates}
    assert by_id["a"].finish_reason == "error" and by_id["a"].token_ids == []
    assert by_id["a"].error.param == "response_format" and "does not allow" in by_id["a"].error.message
    assert by_id["b"].finish_reason is None and by_id["b"].token_ids == [letter]
    assert list(batch.sequences) == ["b"]


def test_the_first_draw_waits_for_the_compile_and_the_prompt_does_not(llama_dir):
    batch, grammars = new_batch(llama_dir)
    digits = Constraint("regex", "[0-9]+")
    pending: Future = Future()
    grammars.compile = lambda _constraint: pending  # a compile that has not finished yet
    for command in start("a", constrained(digits, seed=1), [5, 6, 7, 8, 9]):
        batch.apply(command)
    inputs, _ = batch.plan_step(64)
    assert [(s.token_ids, s.sample) for s in inputs] == [([5, 6, 7, 8], False)]  # all but the draw
    assert batch.plan_step(64) == ([], [])
    pending.set_result(Grammars.compile(grammars, digits).result())
    inputs, _ = batch.plan_step(64)
    assert [(s.token_ids, s.sample) for s in inputs] == [([9], True)]


def test_constraints_travel_on_the_bus_and_stay_off_it_when_absent():
    params = constrained(PERSON, seed=1)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(params), type=SamplingParams) == params
    assert b"constraint" not in msgspec.msgpack.encode(SamplingParams())


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_a_thousand_json_schema_requests_all_validate(build_tiny_model, arch):
    """The issue's count, on each architecture's random weights: `pytest -m slow`."""
    model_dir = build_tiny_model(arch)
    engine = new_engine(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    for i in range(1000):
        engine.submit(f"json-{i}", prompt(i), constrained(PERSON, seed=i))
    engine.run()
    for i in range(1000):
        Person.model_validate_json(tokenizer.decode(engine.outputs[f"json-{i}"], skip_special_tokens=True))
        assert engine.finish_reasons[f"json-{i}"] == "stop"
