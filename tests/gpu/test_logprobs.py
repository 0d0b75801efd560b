"""Logprobs from `ModelRunner.launch`: the drawn token's, the top ones', the asked ids' and the scored
prompt targets', as `PendingStep.logprobs` returns them, checked against transformers' log_softmax
on the same weights; and the rollout's logprobs equal, exactly, those of the sequence fed back."""

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

import gpu.logprobs
from gpu.batch import FROM_PREVIOUS_STEP
from gpu.gemv import linear
from gpu.logprobs import LogprobRequests, ranked_top
from gpu.prompt_graphs import LayerPieces
from gpu.runner import ModelRunner
from gpu.step_io import SequenceInput
from tests.devices import needs_cuda
from tests.gpu.decoding import BLOCK_SIZE, NUM_BLOCKS, random_prompt, shuffled_tables

TOLERANCE = 1e-4
CUDA_TOLERANCE = 1e-3  # float32 on CUDA sums in other orders than transformers on the CPU


@dataclass
class Rollout:
    """One sequence driven through the runner as the executor drives it: its prompt fed in chunks,
    then one decode per token, with the same sampling and logprob settings at every step."""

    prompt: list[int]
    new_tokens: int
    chunk: int
    settings: dict = field(default_factory=dict)
    score_from: int | None = None  # prompt logprobs for positions max(score_from, 1)..; None: none
    arrives: int = 0  # the step it joins at
    output: list[int] = field(default_factory=list)
    drawn: list = field(default_factory=list)  # one PositionLogprobs (or None) per output token
    scored: dict = field(default_factory=dict)  # prompt position -> (logprob, top ids, top logprobs, asked)

    def next_input(self, fed: int, table: list[int]) -> tuple[SequenceInput, int]:
        """This step's input, and the prompt position its first scored entry is for."""
        if fed >= len(self.prompt):
            token = [self.output[-1]]
            return SequenceInput(token, fed, table, sample=True, output_index=len(self.output), **self.settings), 0
        end = min(fed + self.chunk, len(self.prompt))
        scored, first = {}, max(fed, max(self.score_from or 0, 1) - 1)
        last = min(end, len(self.prompt) - 1)  # the prompt's last position draws
        if self.score_from is not None and first < last:
            scored = dict(scored_from=first - fed, scored_targets=tuple(self.prompt[first + 1 : last + 1]))
        chunk = self.prompt[fed:end]
        return SequenceInput(chunk, fed, table, sample=end == len(self.prompt), **self.settings, **scored), first + 1

    def book(self, token, logprobs, first_scored: int) -> None:
        if token is not None:
            self.output.append(token)
            self.drawn.append(logprobs.drawn if logprobs else None)
        if logprobs and logprobs.prompt:
            p = logprobs.prompt
            for i, entry in enumerate(zip(p.logprobs, p.top_ids, p.top_logprobs, p.id_logprobs)):
                self.scored[first_scored + i] = entry


def roll(runner, rollouts: list[Rollout], seed: int = 0) -> list[Rollout]:
    tables = shuffled_tables([len(r.prompt) + r.new_tokens for r in rollouts], seed)
    fed = [0] * len(rollouts)
    step = 0
    while any(len(r.output) < r.new_tokens for r in rollouts):
        inputs, owners = [], []
        for i, r in enumerate(rollouts):
            if r.arrives <= step and len(r.output) < r.new_tokens:
                inputs.append(r.next_input(fed[i], tables[i]))
                owners.append(i)
        pending = runner.launch([given for given, _ in inputs])
        for i, (given, first), token, logprobs in zip(owners, inputs, pending.tokens(), pending.logprobs()):
            fed[i] += len(given.token_ids)
            rollouts[i].book(token, logprobs, first)
        step += 1
    return rollouts


@pytest.fixture(scope="module")
def hf_logprobs():
    """transformers' log_softmax at every position of a token sequence: [len, vocab] float32."""
    models = {}

    def logprobs(model_dir, tokens: list[int]) -> torch.Tensor:
        if model_dir not in models:
            models[model_dir] = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        with torch.no_grad():
            return models[model_dir](torch.tensor([tokens])).logits[0].float().log_softmax(-1)

    return logprobs


def cpu_runner(model_dir) -> ModelRunner:
    return ModelRunner(model_dir, num_kv_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE)


def assert_entry(row: torch.Tensor, token: int, entry, asked: tuple[int, ...], top: int, atol=TOLERANCE) -> None:
    """One position's entry (logprob, top ids, top logprobs, asked ids' logprobs) against the
    reference logprobs `row` [vocab] of the position it was drawn or scored from."""
    logprob, top_ids, top_logprobs, id_logprobs = entry
    assert abs(logprob - row[token].item()) < atol
    assert len(top_ids) == len(top_logprobs) == top
    assert np.allclose(top_logprobs, row.topk(top).values.tolist(), rtol=0, atol=atol)
    assert np.allclose(top_logprobs, row[top_ids].tolist(), rtol=0, atol=atol)
    assert top_logprobs == sorted(top_logprobs, reverse=True)
    assert np.allclose(id_logprobs, row[list(asked)].tolist(), rtol=0, atol=atol)


def test_every_logprob_matches_transformers(tiny_model_dir, hf_logprobs):
    """Chunked prompts scored from different positions, sampled and greedy rows, and a row that asks
    nothing, batched together over prefill and decode steps."""
    asked = (3, 17, 1000)
    rollouts = roll(
        cpu_runner(tiny_model_dir),
        [
            Rollout(
                random_prompt(23, seed=1),
                6,
                chunk=8,
                settings=dict(temperature=1.0, seed=7, logprobs=True, top_logprobs=5, logprob_token_ids=asked),
                score_from=0,
            ),
            Rollout(random_prompt(11, seed=2), 5, chunk=4, settings=dict(logprobs=True, top_logprobs=20), arrives=1),
            Rollout(random_prompt(9, seed=3), 7, chunk=9, settings=dict(temperature=0.8, seed=1)),
            Rollout(random_prompt(19, seed=4), 2, chunk=5, settings=dict(top_logprobs=2), score_from=9, arrives=2),
        ],
    )
    for r in rollouts:
        reference = hf_logprobs(tiny_model_dir, r.prompt + r.output)
        asks, top = r.settings.get("logprob_token_ids", ()), r.settings.get("top_logprobs", 0)
        if r.settings.get("logprobs"):
            for j, (token, drawn) in enumerate(zip(r.output, r.drawn)):
                entry = (drawn.logprobs[0], drawn.top_ids[0], drawn.top_logprobs[0], drawn.id_logprobs[0])
                assert_entry(reference[len(r.prompt) - 1 + j], token, entry, asks, top)
        else:
            assert r.drawn == [None] * r.new_tokens
        if r.score_from is None:
            assert r.scored == {}
            continue
        assert sorted(r.scored) == list(range(max(r.score_from, 1), len(r.prompt)))
        for position, entry in r.scored.items():
            assert_entry(reference[position - 1], r.prompt[position], entry, asks, top)


def reference_processed(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float):
    """The distribution a row draws from, written out token by token: [vocab] logprobs, -inf where filtered."""
    scaled = logits / (temperature or 1.0)
    order = sorted(range(len(scaled)), key=lambda t: -scaled[t].item())
    kept = order[:top_k] if top_k > 0 else order
    probs = scaled[kept].softmax(-1).tolist()
    mass, head = 0.0, []
    for token, p in zip(kept, probs):
        if head and mass >= top_p:
            break
        head.append(token)
        mass += p
    best = scaled[order[0]].item()
    head = [t for t in head if scaled[t].item() >= best + np.log(min_p)] if min_p > 0 else head
    filtered = torch.full_like(scaled, float("-inf"))
    filtered[head] = scaled[head]
    return filtered.log_softmax(-1)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_processed_logprobs_are_of_the_distribution_drawn_from(build_tiny_model, hf_logprobs, arch):
    model_dir = build_tiny_model(arch)
    runner = cpu_runner(model_dir)
    rows = [
        dict(temperature=0.7, top_k=5),
        dict(temperature=1.3, top_p=0.8),
        dict(temperature=0.9, min_p=0.1),
        dict(temperature=1.0, top_k=12, top_p=0.7, min_p=0.05),
        dict(top_k=3),  # greedy: temperature 1, but the filter still applies
        dict(temperature=1.1),
    ]
    prompts = [random_prompt(6 + i, seed=20 + i) for i in range(len(rows))]
    tables = shuffled_tables([len(p) for p in prompts], seed=3)
    asked = (0, 5, 9)
    inputs = [
        SequenceInput(
            p,
            0,
            t,
            sample=True,
            seed=i,
            logprobs=True,
            processed_logprobs=True,
            top_logprobs=8,
            logprob_token_ids=asked,
            **row,
        )  # fmt: skip
        for i, (p, t, row) in enumerate(zip(prompts, tables, rows))
    ]
    pending = runner.launch(inputs)
    for prompt, row, token, logprobs in zip(prompts, rows, pending.tokens(), pending.logprobs()):
        logits = hf_logprobs(model_dir, prompt)[-1]  # log_softmax shifts the logits, which no filter sees
        expected = reference_processed(logits, row.get("temperature", 0.0), row.get("top_k", 0),
                                       row.get("top_p", 1.0), row.get("min_p", 0.0))  # fmt: skip
        drawn = logprobs.drawn
        assert np.isfinite(drawn.logprobs[0]), "the drawn token is in the distribution drawn from"
        assert abs(drawn.logprobs[0] - expected[token].item()) < TOLERANCE
        finite = int(expected.isfinite().sum())
        order = sorted(range(len(expected)), key=lambda t: (-expected[t].item(), t))[:8]
        assert drawn.top_ids[0][: min(finite, 8)] == order[: min(finite, 8)]
        assert drawn.top_ids[0][finite:] == order[finite:]  # filtered tokens tie at -inf: lowest ids first
        assert np.allclose(drawn.top_logprobs[0], expected[order].tolist(), rtol=0, atol=TOLERANCE)
        assert np.allclose(drawn.id_logprobs[0], expected[list(asked)].tolist(), rtol=0, atol=TOLERANCE)


def test_a_step_that_asks_nothing_computes_nothing(build_tiny_model, monkeypatch):
    runner = cpu_runner(build_tiny_model("llama"))
    computed = []
    compute = LogprobRequests.compute
    monkeypatch.setattr(LogprobRequests, "compute", lambda *args: computed.append(1) or compute(*args))
    plain = [
        SequenceInput([20, 21, 22], 0, [0], sample=True, top_logprobs=5),  # top_logprobs without logprobs
        SequenceInput([30, 31], 0, [1], sample=False, logprobs=True),  # nothing drawn, nothing scored
    ]
    pending = runner.launch(plain)
    assert pending.logprobs() == [None, None] and computed == []
    mixed = runner.launch(
        [SequenceInput([23], 3, [0], sample=True), SequenceInput([32], 2, [1], sample=True, logprobs=True)]
    )
    first, second = mixed.logprobs()
    assert first is None and second.drawn is not None and second.prompt is None and len(computed) == 1
    assert runner.launch([]).logprobs() == []


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_a_rollouts_logprobs_equal_its_teacher_forced_prompt_logprobs_exactly(build_tiny_model, arch):
    """What trainers check: the logprob the rollout returned for each sampled token is, bit for bit,
    the prompt logprob of that token when the finished sequence is fed back, however either was cut
    into steps and whatever shared them."""
    runner = cpu_runner(build_tiny_model(arch))
    settings = dict(temperature=1.0, seed=11, logprobs=True, top_logprobs=4)
    rollout, _ = roll(
        runner,
        [
            Rollout(random_prompt(17, seed=5), 12, chunk=6, settings=settings),
            Rollout(random_prompt(30, seed=6), 9, chunk=7, settings=dict(temperature=0.5, seed=2), arrives=1),
        ],
    )
    sequence = rollout.prompt + rollout.output
    for chunk in (len(sequence), 5):
        fed_back = roll(runner, [Rollout(sequence, 1, chunk, settings=dict(top_logprobs=4), score_from=0)], seed=9)[0]
        for j, drawn in enumerate(rollout.drawn):
            logprob, top_ids, top_logprobs, _ = fed_back.scored[len(rollout.prompt) + j]
            assert (logprob, top_ids, top_logprobs) == (drawn.logprobs[0], drawn.top_ids[0], drawn.top_logprobs[0])


def test_rows_computed_in_chunks_give_the_same_results(build_tiny_model, monkeypatch):
    """A long prompt scored whole, and a batch of drawing rows, in chunks of 3 rows: the same numbers."""
    runner = cpu_runner(build_tiny_model("qwen3"))
    settings = dict(temperature=1.0, seed=3, logprobs=True, top_logprobs=3, logprob_token_ids=(4, 8))

    def rolled():
        scored = Rollout(random_prompt(40, seed=8), 2, chunk=40, settings=settings, score_from=0)
        drawing = [Rollout(random_prompt(5, seed=i), 4, chunk=5, settings=settings) for i in range(6)]
        return roll(runner, [scored, *drawing])

    whole = rolled()
    monkeypatch.setattr(gpu.logprobs, "CHUNK_LOGITS", 3 * runner.vocab_size)
    chunked = rolled()
    assert chunked[0].scored == whole[0].scored and len(whole[0].scored) == 39
    assert [r.drawn for r in chunked] == [r.drawn for r in whole]


class PiecesRunEagerly:
    """The prompt graphs' pieces run without capturing them: a CUDA step with prompt tokens, on the CPU."""

    def __init__(self, runner: ModelRunner, count: int) -> None:
        self.count, self.runs = count, 0
        self.pieces = LayerPieces(runner.model, runner.kv, count)

    def padded_tokens(self, num_tokens: int) -> int | None:
        return self.count if num_tokens <= self.count else None

    def run(self, batch):
        self.runs += 1
        return self.pieces.forward(batch, self.pieces.run_piece)


def test_prompt_chunks_run_in_the_prompt_graphs_pieces_score_as_run_whole(build_tiny_model):
    """Scored positions take their logits from the pieces' last-layer buffers, grown with filler."""
    prompt = random_prompt(30, seed=12)
    settings = dict(temperature=1.0, seed=3, logprobs=True, top_logprobs=3)
    runs = []
    for in_pieces in (False, True):
        runner = cpu_runner(build_tiny_model("llama"))
        if in_pieces:
            runner.prompt_graphs = PiecesRunEagerly(runner, count=32)
        runs.append(roll(runner, [Rollout(prompt, 3, chunk=12, settings=settings, score_from=2)])[0])
    whole, pieced = runs
    assert runner.prompt_graphs.runs == 3  # the three chunks
    assert pieced.scored == whole.scored and len(whole.scored) == 28
    assert pieced.drawn == whole.drawn and pieced.output == whole.output


def test_top_logprobs_rank_ties_by_lower_id():
    inf = float("inf")
    values = torch.tensor(
        [
            [-1.0, -0.5, -1.0, -0.5, -2.0, -inf],
            [-inf, -inf, -3.0, -inf, -inf, -inf],  # one finite token, then the lowest ids of the rest
            [0.0, -0.0, 0.0, -1.0, -1e-30, -0.0],  # -0.0 equals 0.0
        ]
    )
    assert ranked_top(values, 4).tolist() == [[1, 3, 0, 2], [2, 0, 1, 3], [0, 1, 2, 5]]
    assert ranked_top(values, 0).shape == (3, 0)


def test_top_logprobs_rank_as_a_full_sort_would_on_rows_full_of_ties():
    generator = torch.Generator().manual_seed(1)
    levels = torch.tensor([0.0, -0.0, -0.5, -1.0, -2.0, float("-inf")])
    values = levels[torch.randint(len(levels), (64, 40), generator=generator)]
    values[::7] = torch.randn(10, 40, generator=generator)  # some rows with no tie at all
    for top in (1, 3, 8, 20, 40):
        expected = [sorted(range(40), key=lambda t: (-row[t].item(), t))[:top] for row in values]
        assert ranked_top(values, top).tolist() == expected


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(logprobs=True, top_logprobs=21), "top_logprobs must be 0..20"),
        (dict(logprobs=True, logprob_token_ids=(5, 1024)), "logprob_token_ids must be token ids below 1024"),
        (dict(scored_targets=(5, 1024)), "scored_targets must be token ids below 1024"),
        (
            dict(scored_from=2, scored_targets=(5, 6, 7)),
            "scored_targets must score fed positions within 0..3, got 3 from scored_from 2",
        ),
        (dict(scored_from=-1, scored_targets=(5,)), "scored_targets must score .* got 1 from scored_from -1"),
    ],
)
def test_bad_asks_are_rejected_before_any_work(build_tiny_model, bad, message):
    runner = cpu_runner(build_tiny_model("llama"))
    before = runner.kv.layers[0].clone()
    with pytest.raises(ValueError, match=f"sequence 1: {message}"):
        runner.launch(
            [SequenceInput([7], 0, [3], sample=True), SequenceInput([1, 2, 3, 4, 5], 0, [0], sample=True, **bad)]
        )
    assert torch.equal(runner.kv.layers[0], before)


def test_a_rows_product_on_the_cpu_is_the_same_in_any_batch():
    """What makes teacher forcing exact on the CPU: a token's projection does not depend on how many
    tokens share the product (MKL sums a partial block of rows in another order)."""
    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(67, 64, generator=generator), torch.randn(200, 64, generator=generator)
    whole = linear(x, weight)
    for rows in (1, 2, 3, 5, 7, 13, 66):
        assert torch.equal(linear(x[:rows], weight), whole[:rows])
        assert torch.equal(linear(x[rows : rows + 1], weight), whole[rows : rows + 1])


@pytest.mark.gpu
@needs_cuda
def test_logprobs_on_cuda_graphs_match_transformers(tiny_model_dir, hf_logprobs):
    """float32 on CUDA with decode and prompt graphs (a scored chunk runs in the prompt graphs' pieces),
    each step launched before the previous one's logprobs are read, as the executor overlaps them."""
    runner = ModelRunner(
        tiny_model_dir, device="cuda", dtype="float32", num_kv_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE
    )
    assert runner.graphs is not None and runner.prompt_graphs is not None
    settings = dict(temperature=1.0, seed=4, logprobs=True, top_logprobs=5, logprob_token_ids=(3, 9))
    r = Rollout(random_prompt(21, seed=9), 8, chunk=21, settings=settings, score_from=1)
    table = shuffled_tables([len(r.prompt) + r.new_tokens], seed=1)[0]
    given, first = r.next_input(0, table)
    pending, fed = runner.launch([given]), len(given.token_ids)
    while len(r.output) < r.new_tokens - 1:
        following = runner.launch(
            [
                SequenceInput(
                    [FROM_PREVIOUS_STEP],
                    fed,
                    table,
                    sample=True,
                    output_index=len(r.output) + 1,
                    previous_row=0,
                    **settings,
                )
            ]
        )
        r.book(pending.tokens()[0], pending.logprobs()[0], first)
        pending, fed = following, fed + 1
    r.book(pending.tokens()[0], pending.logprobs()[0], first)
    reference = hf_logprobs(tiny_model_dir, r.prompt + r.output)
    for j, (token, drawn) in enumerate(zip(r.output, r.drawn)):
        entry = (drawn.logprobs[0], drawn.top_ids[0], drawn.top_logprobs[0], drawn.id_logprobs[0])
        assert_entry(reference[len(r.prompt) - 1 + j], token, entry, (3, 9), 5, atol=CUDA_TOLERANCE)
    assert sorted(r.scored) == list(range(1, len(r.prompt)))
    for position, entry in r.scored.items():
        assert_entry(reference[position - 1], r.prompt[position], entry, (3, 9), 5, atol=CUDA_TOLERANCE)
