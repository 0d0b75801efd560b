"""What an RL rollout needs of the bus API, through a real server: logprobs equal to transformers'
log-softmax (sampled tokens, top alternatives, prompt tokens), a rollout's logprobs equal to the
prompt logprobs of the same sequence sent back (teacher forcing), a prompt scored alone
(max_tokens 0), aborts that return every token generated so far with its logprobs, stop regexes,
and cache salts. One server for the file: three sequences at a time (so a fourth waits) and small
prefill chunks (so a prompt is scored across several)."""

import time
import uuid

import msgspec
import pytest
import torch
from transformers import AutoModelForCausalLM

from ops.local_server import start_server
from schemas.errors import Error
from schemas.generate import AbortGenerate, GenerateChunk, GenerateRequest, GenerateResult, SamplingParams
from schemas.requests import Aborted
from tests.over_http import random_prompts

Reply = GenerateChunk | GenerateResult | Error
TOLERANCE = 1e-4
MAX_NUM_SEQS = 3


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    running = start_server(
        tmp_path_factory.mktemp("rollouts"),
        "--num-kv-blocks",
        "256",
        "--max-num-seqs",
        str(MAX_NUM_SEQS),
        "--max-prefill-tokens",
        "24",
    )
    yield running
    running.stop()


@pytest.fixture(scope="module")
def log_softmax(server):
    """The float32 log-softmax of transformers' logits at every position of a sequence: [positions, vocab]."""
    model = AutoModelForCausalLM.from_pretrained(server.model_dir, dtype=torch.float32)
    model.eval()

    def compute(token_ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            logits = model(torch.tensor([token_ids])).logits[0].float()
        return torch.log_softmax(logits, dim=-1)

    return compute


@pytest.fixture
async def nc(server):
    connection = await server.connect_nats()
    yield connection
    await connection.drain()


def prompt(seed: int) -> list[int]:
    return random_prompts(1, seed, high=1500)[0]


async def generate(nc, request: GenerateRequest) -> GenerateResult:
    reply = msgspec.msgpack.decode(
        (await nc.request("llm.generate", msgspec.msgpack.encode(request), timeout=120)).data, type=Reply
    )
    assert isinstance(reply, GenerateResult), reply
    return reply


async def abort(nc, message: AbortGenerate) -> Aborted:
    reply = await nc.request("llm.generate", msgspec.msgpack.encode(message), timeout=30)
    return msgspec.msgpack.decode(reply.data, type=Aborted | Error)


def check_positions(logprobs, reference: torch.Tensor, token_ids: list[int], top: int, asked: list[int]) -> None:
    """Entry i of `logprobs` is the token `token_ids[i]` predicted by the reference row i."""
    assert len(logprobs.logprobs) == len(token_ids) == reference.shape[0]
    for i, token in enumerate(token_ids):
        row = reference[i]
        assert abs(logprobs.logprobs[i] - row[token].item()) < TOLERANCE, (i, token)
        if top:
            values, ids = row.topk(top)
            assert logprobs.top_ids[i] == ids.tolist(), i
            assert max(abs(a - b) for a, b in zip(logprobs.top_logprobs[i], values.tolist())) < TOLERANCE
        if asked:
            assert max(abs(a - row[t].item()) for a, t in zip(logprobs.id_logprobs[i], asked)) < TOLERANCE


@pytest.mark.parametrize(
    "sampling",
    [dict(temperature=0), dict(temperature=1.0, seed=11), dict(temperature=0.7, top_k=20, top_p=0.9, seed=3)],
    ids=["greedy", "sampled", "filtered"],
)
async def test_logprobs_equal_transformers_log_softmax(nc, log_softmax, sampling):
    """Of the raw logits whatever the sampling: the drawn tokens', the top five and two asked ids',
    at the prompt's positions (from 5 on, scored over several prefill chunks) and the outputs'."""
    prompt_ids, asked = prompt(1), [3, 700]
    params = SamplingParams(
        max_tokens=12,
        ignore_eos=True,
        logprobs=True,
        top_logprobs=5,
        logprob_token_ids=asked,
        prompt_logprobs_from=5,
        **sampling,
    )
    result = await generate(nc, GenerateRequest(input_ids=prompt_ids, params=params))
    reference = log_softmax(prompt_ids + result.token_ids)
    n = len(prompt_ids)
    assert result.prompt_ids == prompt_ids and result.logprobs.start == 0 and result.prompt_logprobs.start == 5
    check_positions(result.prompt_logprobs, reference[4 : n - 1], prompt_ids[5:], 5, asked)
    check_positions(result.logprobs, reference[n - 1 : n - 1 + 12], result.token_ids, 5, asked)
    if sampling["temperature"] == 0:
        assert result.token_ids == reference[n - 1 : -1].argmax(-1).tolist()


async def test_a_request_without_text_gets_the_same_logprobs_straight_from_the_steps(nc):
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=True, top_logprobs=2)
    params = msgspec.structs.replace(params, prompt_logprobs_from=3)
    with_text = await generate(nc, GenerateRequest(input_ids=prompt(6), params=params))
    without = msgspec.structs.replace(params, detokenize=False)
    inbox = nc.new_inbox()
    replies = await nc.subscribe(inbox)
    request = GenerateRequest(input_ids=prompt(6), params=without, stream=True)
    await nc.publish("llm.generate", msgspec.msgpack.encode(request), reply=inbox)
    chunks = []
    while not isinstance(
        item := msgspec.msgpack.decode((await replies.next_msg(timeout=60)).data, type=Reply), GenerateResult
    ):
        chunks.append(item)
    assert (item.text, item.token_ids, item.logprobs) == ("", with_text.token_ids, with_text.logprobs)
    assert item.prompt_logprobs == with_text.prompt_logprobs
    assert [lp for c in chunks for lp in c.logprobs.logprobs] == with_text.logprobs.logprobs


async def test_processed_logprobs_are_of_the_distribution_drawn_from(nc, log_softmax):
    prompt_ids = prompt(2)
    params = SamplingParams(
        max_tokens=6, ignore_eos=True, temperature=0.5, top_k=10, seed=5, logprobs=True, processed_logprobs=True
    )
    result = await generate(nc, GenerateRequest(input_ids=prompt_ids, params=params))
    n = len(prompt_ids)
    with torch.no_grad():
        raw = log_softmax(prompt_ids + result.token_ids)[n - 1 : n - 1 + 6]  # log-softmax keeps the logits' order
    kept = raw.topk(10).indices
    scaled = torch.full_like(raw, float("-inf")).scatter(1, kept, raw.gather(1, kept) / 0.5)
    check_positions(result.logprobs, torch.log_softmax(scaled, -1), result.token_ids, 0, [])


async def test_a_rollouts_logprobs_are_the_prompt_logprobs_of_its_sequence_sent_back(nc):
    """Teacher forcing, as trainers check it: the finished sequence as a prompt, scored alone."""
    prompt_ids = prompt(3)
    rollout = await generate(
        nc,
        GenerateRequest(
            input_ids=prompt_ids,
            params=SamplingParams(max_tokens=20, temperature=1.0, seed=9, ignore_eos=True, logprobs=True),
        ),
    )
    scoring = SamplingParams(max_tokens=0, prompt_logprobs_from=len(prompt_ids))
    forced = await generate(nc, GenerateRequest(input_ids=prompt_ids + rollout.token_ids, params=scoring))
    assert (forced.finish_reason, forced.token_ids, forced.completion_tokens) == ("length", [], 0)
    assert forced.prompt_logprobs.start == len(prompt_ids)
    assert forced.prompt_logprobs.logprobs == rollout.logprobs.logprobs


async def test_a_prompt_alone_is_scored_from_its_first_position(nc, log_softmax):
    started = time.time()
    text = GenerateRequest(text="Once upon a time", params=SamplingParams(max_tokens=0, prompt_logprobs_from=0))
    result = await generate(nc, text)
    assert (result.finish_reason, result.token_ids, result.text, result.logprobs) == ("length", [], "", None)
    assert result.prompt_logprobs.start == 1  # the first token has none
    check_positions(result.prompt_logprobs, log_softmax(result.prompt_ids)[:-1], result.prompt_ids[1:], 0, [])
    assert started - 1 <= result.created <= time.time()


async def test_an_aborted_request_returns_every_token_it_streamed_and_their_logprobs(nc, log_softmax):
    prompt_ids, request_id = prompt(4), uuid.uuid4().hex
    params = SamplingParams(max_tokens=3000, temperature=0, ignore_eos=True, logprobs=True)
    request = GenerateRequest(input_ids=prompt_ids, params=params, stream=True, request_id=request_id)
    inbox = nc.new_inbox()
    replies = await nc.subscribe(inbox)
    await nc.publish("llm.generate", msgspec.msgpack.encode(request), reply=inbox)
    chunks = []
    while len(chunks) < 3:
        chunks.append(msgspec.msgpack.decode((await replies.next_msg(timeout=60)).data, type=Reply))
    assert await abort(nc, AbortGenerate(request_id=request_id)) == Aborted([request_id])
    while not isinstance(
        item := msgspec.msgpack.decode((await replies.next_msg(timeout=60)).data, type=Reply), GenerateResult
    ):
        chunks.append(item)
    assert item.finish_reason == "abort" and 3 <= item.completion_tokens < 3000
    assert item.token_ids == [t for c in chunks for t in c.token_ids]
    assert item.logprobs.logprobs == [lp for c in chunks for lp in c.logprobs.logprobs]
    n = len(prompt_ids)
    check_positions(item.logprobs, log_softmax(prompt_ids + item.token_ids)[n - 1 : -1], item.token_ids, 0, [])
    assert await abort(nc, AbortGenerate(request_id=request_id)) == Aborted([])  # it has ended


async def test_abort_all_ends_running_and_waiting_requests_with_what_they_have(nc, server):
    """One more request than run at a time: the last waits, and ends with no tokens. Every end
    comes from downstream (the executor's, or the scheduler's for the waiting one), none from the
    origin's wait running out."""
    long = SamplingParams(max_tokens=3000, temperature=0, ignore_eos=True)
    streams = []
    for i in range(MAX_NUM_SEQS + 1):
        inbox = nc.new_inbox()
        streams.append(await nc.subscribe(inbox))
        request = GenerateRequest(input_ids=prompt(10 + i), params=long, stream=True)
        await nc.publish("llm.generate", msgspec.msgpack.encode(request), reply=inbox)
    for running in streams[:MAX_NUM_SEQS]:  # each has streamed a chunk; the last waits for room
        assert isinstance(msgspec.msgpack.decode((await running.next_msg(timeout=60)).data, type=Reply), GenerateChunk)
    aborted = await abort(nc, AbortGenerate(abort_all=True))
    assert isinstance(aborted, Aborted) and len(aborted.request_ids) == MAX_NUM_SEQS + 1
    results = []
    for replies in streams:
        while not isinstance(
            item := msgspec.msgpack.decode((await replies.next_msg(timeout=60)).data, type=Reply), GenerateResult
        ):
            pass
        results.append(item)
    assert [r.finish_reason for r in results] == ["abort"] * (MAX_NUM_SEQS + 1)
    assert [r.completion_tokens > 0 for r in results] == [True] * MAX_NUM_SEQS + [False]
    assert all(r.completion_tokens == len(r.token_ids) < 3000 for r in results)
    assert not server.find("abort_ended_at_origin")
    after = await generate(nc, GenerateRequest(input_ids=prompt(5), params=SamplingParams(max_tokens=4)))
    assert after.completion_tokens == 4  # the server serves on


async def test_a_stop_regex_ends_the_text_and_the_tokens_and_logprobs_with_it(nc):
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, logprobs=True)
    whole = await generate(nc, GenerateRequest(text="The quick brown fox", params=params))
    target = whole.text[len(whole.text) // 2 :][:3]
    pattern = "".join(f"[{c}]" if c.isalnum() else f"\\x{ord(c):02x}" for c in target)  # matches `target` alone
    regex_params = msgspec.structs.replace(params, stop_regex=[pattern], include_stop_str_in_output=True)
    cut = await generate(nc, GenerateRequest(text="The quick brown fox", params=regex_params))
    end = whole.text.index(target) + len(target)
    assert (cut.finish_reason, cut.matched_stop, cut.text) == ("stop", pattern, whole.text[:end])
    assert cut.token_ids == whole.token_ids[: len(cut.token_ids)] and cut.completion_tokens == len(cut.token_ids)
    assert cut.logprobs.logprobs == whole.logprobs.logprobs[: len(cut.token_ids)]
    # the tokens end with the one whose text completed the match
    assert len(cut.token_ids) < len(whole.token_ids)


async def test_a_salted_prefix_is_read_only_under_its_salt(nc):
    prompt_ids = prompt(20) * 2  # long enough for whole blocks
    params = SamplingParams(max_tokens=2)

    async def cached(salt: str) -> int:
        return (await generate(nc, GenerateRequest(input_ids=prompt_ids, params=params, cache_salt=salt))).cached_tokens

    assert await cached("a") == 0
    assert await cached("a") > 0
    assert await cached("b") == 0
    assert await cached("") == 0  # an unsalted request reads no salted prefix
    assert await cached("") > 0


# Llama is this module's server (the demo model), whose logprobs and teacher forcing the tests above
# check; Qwen3 is the architecture furthest from it (per-head norms). The executor loads every
# architecture into the ModelRunner that tests/gpu/test_logprobs.py checks on all four (Qwen2's
# q/k/v biases, Mistral's Llama layers) against transformers, teacher forcing included.
async def test_another_architecture_returns_transformers_logprobs_and_teacher_forces_exactly(tmp_path):
    """Through a Qwen3 server: the sampled, top and prompt logprobs are transformers' log-softmax
    within 1e-4, and the finished sequence scored as a prompt gives the rollout's back, exactly."""
    from gpu.model_builder import build_model_dir

    model_dir = build_model_dir(tmp_path / "model", arch="qwen3")
    running = start_server(
        tmp_path / "server", "--num-kv-blocks", "128", "--max-prefill-tokens", "16", model=str(model_dir)
    )
    try:
        nc = await running.connect_nats()
        prompt_ids = prompt(4)
        params = SamplingParams(
            max_tokens=10,
            temperature=1.0,
            seed=4,
            ignore_eos=True,
            logprobs=True,
            top_logprobs=3,
            prompt_logprobs_from=1,
        )
        rollout = await generate(nc, GenerateRequest(input_ids=prompt_ids, params=params))
        scoring = SamplingParams(max_tokens=0, prompt_logprobs_from=len(prompt_ids))
        forced = await generate(nc, GenerateRequest(input_ids=prompt_ids + rollout.token_ids, params=scoring))
        await nc.drain()
    finally:
        running.stop()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        reference = torch.log_softmax(model(torch.tensor([prompt_ids + rollout.token_ids])).logits[0].float(), -1)
    n = len(prompt_ids)
    check_positions(rollout.prompt_logprobs, reference[: n - 1], prompt_ids[1:], 3, [])
    check_positions(rollout.logprobs, reference[n - 1 : -1], rollout.token_ids, 3, [])
    assert forced.prompt_logprobs.logprobs == rollout.logprobs.logprobs
