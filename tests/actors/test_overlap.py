"""Overlapped steps: the engine launches step N+1 before it books step N, feeding decodes the tokens
step N drew while they are still on the device. What a client sees must not change: no token after
a stop, nothing of a dropped sequence after its drop, and the very tokens of the synchronous path.
"""

import random

import pytest

from actors.executor.running_batch import RunningBatch
from actors.inprocess import InProcessEngine
from gpu.batch import FROM_PREVIOUS_STEP
from gpu.model_builder import build_model_dir
from gpu.runner import ModelRunner
from gpu.step_io import SequenceInput
from schemas.generate import SamplingParams
from schemas.step import PrefillChunk, StartSequence
from tests.devices import needs_cuda
from tests.sampling import greedy


def seeded(max_tokens: int, seed: int, **more) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.8, top_p=0.9, top_k=30, seed=seed, **more)


@pytest.fixture(scope="module")
def llama_dir(build_tiny_model):
    return build_tiny_model("llama")


def new_runner(model_dir, num_kv_blocks: int = 64) -> ModelRunner:
    return ModelRunner(model_dir, device="cpu", num_kv_blocks=num_kv_blocks, block_size=4)


def in_flight_ids(engine: InProcessEngine) -> list[str]:
    """The requests the step launched but not yet booked computes for."""
    return [p.seq.request_id for p in engine.in_flight[1]] if engine.in_flight else []


def test_previous_row_feeds_the_token_the_last_launch_drew(llama_dir):
    """Step 2 reads step 1's tokens on the device, in another order and past a row that drew none,
    before step 1 is collected: the same tokens as feeding them by value."""
    a, b, chunk = [11, 12, 13, 14, 15], [21, 22, 23], [31, 32, 33, 34]
    first = [
        SequenceInput(a, 0, [0, 1], sample=True),
        SequenceInput(chunk, 0, [2], sample=False),
        SequenceInput(b, 0, [3], sample=True, temperature=0.8, seed=3),
    ]
    synchronous = new_runner(llama_dir)
    drawn = synchronous.step(first)
    by_value = synchronous.step(
        [
            SequenceInput([drawn[2]], 3, [3], sample=True, temperature=0.8, seed=3, output_index=1),
            SequenceInput([drawn[0]], 5, [0, 1], sample=True),
        ]
    )
    overlapped = new_runner(llama_dir)
    pending = overlapped.launch(first)
    second = overlapped.launch(
        [
            SequenceInput([FROM_PREVIOUS_STEP], 3, [3], True, temperature=0.8, seed=3, output_index=1, previous_row=2),
            SequenceInput([FROM_PREVIOUS_STEP], 5, [0, 1], sample=True, previous_row=0),
        ]
    )
    assert pending.tokens() == drawn
    assert second.tokens() == by_value


@pytest.mark.parametrize(
    "bad, message",
    [
        (SequenceInput([FROM_PREVIOUS_STEP], 4, [2, 3], sample=True, previous_row=1), "drew no token"),
        (SequenceInput([FROM_PREVIOUS_STEP], 4, [2, 3], sample=True, previous_row=7), "drew no token"),
        (SequenceInput([9], 4, [2, 3], sample=True, previous_row=0), "FROM_PREVIOUS_STEP"),
        (SequenceInput([FROM_PREVIOUS_STEP], 4, [2, 3], sample=True), "token ids"),
    ],
)
def test_a_bad_reference_to_the_previous_step_is_rejected(llama_dir, bad, message):
    runner = new_runner(llama_dir)
    with pytest.raises(ValueError, match="none was launched"):
        runner.launch([SequenceInput([FROM_PREVIOUS_STEP], 0, [0], sample=True, previous_row=0)])
    runner.launch([SequenceInput([5, 6], 0, [0], sample=True), SequenceInput([7], 0, [1], sample=False)])
    with pytest.raises(ValueError, match=message):
        runner.launch([bad])


def first_new_token(tokens: list[int], at_least: int) -> int:
    """The first index from `at_least` on whose token does not occur before it."""
    return next(k for k in range(at_least, len(tokens)) if tokens[k] not in tokens[:k])


@pytest.mark.parametrize("how", ["eos", "stop_token_id"])
def test_no_token_follows_a_stop_drawn_while_the_next_step_ran(llama_dir, how):
    prompt, neighbour = [(13 * i) % 800 + 5 for i in range(9)], [(7 * i) % 800 + 5 for i in range(6)]
    runner = new_runner(llama_dir)
    reference = InProcessEngine(runner, max_prefill_tokens=8)
    reference.submit("r", prompt, greedy(24))
    reference.run()
    alone = reference.outputs["r"]
    k = first_new_token(alone, 4)
    stop = alone[k]

    if how == "eos":
        runner = new_runner(llama_dir)
        runner.eos_token_ids = [stop]
        params = SamplingParams(max_tokens=24, temperature=0.0)
    else:
        params = greedy(24, stop_token_ids=[stop])
    engine = InProcessEngine(runner, max_prefill_tokens=8)
    engine.submit("r", prompt, params)
    engine.submit("neighbour", neighbour, greedy(24))  # keeps the engine stepping after r stops
    wasted_rows = 0
    while engine.busy:
        output = engine.step()
        if any(u.request_id == "r" and u.finish_reason for u in output.updates):
            wasted_rows += in_flight_ids(engine).count("r")  # r's next step, launched before its stop was seen
    assert engine.outputs["r"] == alone[: k + 1]
    assert engine.finish_reasons["r"] == "stop"
    assert wasted_rows == 1
    assert len(engine.outputs["neighbour"]) == 24


def test_a_request_at_its_token_limit_gets_no_step_past_it(llama_dir):
    """max_tokens is known when planning: unlike a stop, the limit costs no wasted row."""
    runner = new_runner(llama_dir)
    engine = InProcessEngine(runner, max_prefill_tokens=8)
    launched, draws = runner.launch, []

    def counting_launch(seqs, masks=None):
        draws.append(sum(s.sample for s in seqs))
        return launched(seqs, masks)

    runner.launch = counting_launch
    try:
        engine.submit("r", list(range(50, 70)), greedy(7))
        engine.run()
    finally:
        del runner.launch
    assert len(engine.outputs["r"]) == 7 and engine.finish_reasons["r"] == "length"
    assert sum(draws) == 7


def test_each_step_reports_the_host_time_of_its_launch(llama_dir):
    """What the benchmark reads as the runner's share of a step: the launch's host time, and none
    for the last step, which only books the one before it."""
    engine = InProcessEngine(new_runner(llama_dir), max_prefill_tokens=8)
    engine.submit("r", [5, 6, 7], greedy(2))
    launch_s = []
    while engine.busy:
        engine.step()
        launch_s.append(engine.launch_s)
    assert len(launch_s) == 3  # the prompt, the second token, then the booking of that token
    assert launch_s[0] > 0 and launch_s[1] > 0 and launch_s[2] == 0.0


def test_a_sequence_dropped_while_its_step_runs_publishes_nothing_after(llama_dir):
    runner = new_runner(llama_dir)
    engine = InProcessEngine(runner, max_prefill_tokens=8)
    engine.submit("gone", list(range(40, 52)), seeded(40, 7))
    engine.submit("stays", list(range(60, 70)), greedy(20))
    while len(engine.outputs["gone"]) < 3 or "gone" not in in_flight_ids(engine):
        engine.step()
    received = list(engine.outputs["gone"])
    engine.abort("gone")
    after = []
    while engine.busy:
        after.append(engine.step())
    assert "gone" in after[0].dropped
    assert [u for output in after for u in output.updates if u.request_id == "gone"] == []
    assert engine.outputs["gone"] == received
    reference = InProcessEngine(runner, max_prefill_tokens=8)
    reference.submit("stays", list(range(60, 70)), greedy(20))
    reference.run()
    assert engine.outputs["stays"] == reference.outputs["stays"]


def mixed_workload(seed: int) -> list[tuple[int, list[int], SamplingParams]]:
    """(arrival step, prompt, params): greedy and seeded requests, long prompts that prefill in
    chunks beside decodes, some that end on a stop token id, one at a time limit."""
    rng = random.Random(seed)
    requests = []
    for i in range(10):
        prompt = [rng.randrange(5, 900) for _ in range(rng.randrange(3, 40))]
        stop = {"stop_token_ids": [rng.randrange(5, 900) for _ in range(40)]} if i % 3 == 0 else {}
        max_tokens = rng.randrange(1, 30)
        params = greedy(max_tokens, **stop) if i % 2 else seeded(max_tokens, rng.randrange(2**31), **stop)
        requests.append((rng.choice([0, 0, 1, 2, 5, 9]), prompt, params))
    return requests


@pytest.mark.parametrize("num_kv_blocks", [64, 20])  # 20: preemptions too
@pytest.mark.parametrize("seed", [0, 1])
def test_overlapped_steps_draw_the_tokens_of_synchronous_steps(llama_dir, seed, num_kv_blocks):
    runner = new_runner(llama_dir, num_kv_blocks)
    workload = mixed_workload(seed)
    runs = {}
    for overlap in (False, True):
        engine = InProcessEngine(runner, max_prefill_tokens=8, overlap=overlap)
        launched = runner.launch
        by_reference = []

        def counting_launch(seqs, masks=None):
            by_reference.append(sum(s.previous_row >= 0 for s in seqs))
            return launched(seqs, masks)

        runner.launch = counting_launch
        try:
            engine.run(
                lambda step: [
                    engine.submit(f"r{i}", prompt, params)
                    for i, (arrival, prompt, params) in enumerate(workload)
                    if arrival == step
                ],
                min_steps=10,
            )
        finally:
            del runner.launch
        runs[overlap] = engine.outputs, engine.finish_reasons
        assert (sum(by_reference) > 0) == overlap  # decodes read the last step's tokens on the device
    assert runs[True] == runs[False]
    assert "stop" in runs[True][1].values() and "length" in runs[True][1].values()


def decode_chain(runner: ModelRunner, n: int, steps: int, overlap: bool) -> list[list[int]]:
    """n sequences, greedy and seeded in turn: a 3-token prompt, then `steps` decodes, listed in
    reverse order every step so that no sequence reads its own row. Overlapped, every step is
    launched before any is collected, each feeding the tokens of the one before on the device."""
    kinds = [dict(temperature=0.8, top_k=20, seed=i) if i % 2 else {} for i in range(n)]
    tables = [[2 * i, 2 * i + 1] for i in range(n)]
    order = list(range(n))
    first = [SequenceInput([5 + i % 900, 7, 9], 0, tables[i], sample=True, **kinds[i]) for i in order]
    launched, outputs = [(runner.launch(first), order)], [[] for _ in range(n)]
    if not overlap:
        outputs = [[t] for t in launched.pop()[0].tokens()]
    for k in range(1, steps + 1):
        row_of = {seq: row for row, seq in enumerate(order)}
        order = order[::-1]
        launched.append(
            (
                runner.launch(
                    [
                        SequenceInput(
                            [FROM_PREVIOUS_STEP] if overlap else [outputs[i][-1]],
                            2 + k,
                            tables[i],
                            sample=True,
                            output_index=k,
                            previous_row=row_of[i] if overlap else -1,
                            **kinds[i],
                        )
                        for i in order
                    ]
                ),
                order,
            )
        )
        if not overlap:
            pending, rows = launched.pop()
            for i, token in zip(rows, pending.tokens()):
                outputs[i].append(token)
    for pending, rows in launched:
        for i, token in zip(rows, pending.tokens()):
            outputs[i].append(token)
    return outputs


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("backend", ["triton", "flashinfer"])
def test_on_cuda_tokens_read_on_the_device_are_the_tokens_drawn(tmp_path, backend):
    """Through CUDA graphs (3 sequences padded to 4, 100 to 128) and eagerly (300, above the
    largest graph), with many steps in flight: the same batches give the same tokens either way."""
    if backend == "flashinfer":
        pytest.importorskip("flashinfer")
    model_dir = build_model_dir(tmp_path / "llama", arch="llama", size="hd128", seed=5)
    runner = ModelRunner(model_dir, device="cuda", num_kv_blocks=600, block_size=16, attention_backend=backend)
    assert runner.graphs is not None
    for n in (3, 100, 300):
        assert decode_chain(runner, n, 12, overlap=True) == decode_chain(runner, n, 12, overlap=False)


def test_decodes_come_before_prompt_chunks_in_a_step():
    """The attention backend runs a mixed step's leading one-token rows with its decode kernel, so
    the running batch lists every decode before the chunks, even one admitted after them."""
    batch = RunningBatch(block_size=4, max_model_len=64, eos_token_ids=[], vocab_size=1000)
    batch.apply(StartSequence("long", greedy(4), list(range(0, 8))))
    for start in (0, 8, 16):
        batch.apply(PrefillChunk("long", list(range(10 + start, 18 + start)), start, last=start == 16))
    batch.apply(StartSequence("short", greedy(4), list(range(8, 12))))
    batch.apply(PrefillChunk("short", [1, 2, 3], 0, last=True))
    inputs, plan = batch.plan_step(max_prefill_tokens=8)  # long's first chunk; short's waits for budget
    assert [len(i.token_ids) for i in inputs] == [8]
    batch.book(plan, [None])
    inputs, plan = batch.plan_step(max_prefill_tokens=11)  # long's second chunk and short's prompt
    assert [len(i.token_ids) for i in inputs] == [8, 3]
    batch.book(plan, [None, 5])
    inputs, _ = batch.plan_step(max_prefill_tokens=8)  # short decodes, long's last chunk after it
    assert [(i.token_ids, i.start_position) for i in inputs] == [([5], 3), (list(range(26, 34)), 16)]


def test_a_chunk_past_the_budget_is_cut_and_its_rest_goes_first_next_step():
    batch = RunningBatch(block_size=4, max_model_len=64, eos_token_ids=[], vocab_size=1000)
    batch.apply(StartSequence("long", greedy(4), list(range(0, 4))))
    batch.apply(PrefillChunk("long", list(range(10, 20)), 0, last=True))
    batch.apply(StartSequence("short", greedy(4), [4]))
    batch.apply(PrefillChunk("short", [1, 2], 0, last=True))
    steps = []
    for _ in range(3):
        inputs, plan = batch.plan_step(max_prefill_tokens=4)
        steps.append([(i.token_ids, i.start_position, i.sample) for i in inputs])
        batch.book(plan, [5 if i.sample else None for i in inputs])
    assert steps == [
        [(list(range(10, 14)), 0, False)],
        [(list(range(14, 18)), 4, False)],
        [([18, 19], 8, True), ([1, 2], 0, True)],  # only the piece that ends the prompt draws a token
    ]
