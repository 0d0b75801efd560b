"""Per-token controls through the plain scheduler and executor objects and a real tiny model on the
CPU, steps overlapped as the executor runs them: penalties equal transformers' generate with the
same penalties, through preemptions and reused penalty slots; masks, bias and min_tokens hold at
every token; seeded draws with rules do not depend on the batch; bad ids are refused by field."""

import random

import pytest
import torch
from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

from actors.executor.sequence_rules import FreeSlots, temperature_at
from actors.inprocess import InProcessEngine
from gpu.model_builder import build_model_dir
from gpu.runner import ModelRunner
from schemas.generate import SamplingParams
from tests.devices import needs_cuda
from tests.sampling import greedy


@pytest.fixture(scope="module")
def llama_dir(build_tiny_model):
    return build_tiny_model("llama")


def new_engine(model_dir, num_kv_blocks: int = 64) -> InProcessEngine:
    runner = ModelRunner(model_dir, device="cpu", num_kv_blocks=num_kv_blocks, block_size=4)
    return InProcessEngine(runner, max_prefill_tokens=8)


def run(engine: InProcessEngine, requests: list[tuple[list[int], SamplingParams]], arrivals: list[int]) -> list:
    engine.run(
        lambda step: [
            engine.submit(f"r{i}", prompt, params) for i, (prompt, params) in enumerate(requests) if arrivals[i] == step
        ],
        min_steps=max(arrivals) + 1,
    )
    return [engine.outputs[f"r{i}"] for i in range(len(requests))]


def alone(model_dir, prompt: list[int], params: SamplingParams) -> list[int]:
    return run(new_engine(model_dir), [(prompt, params)], [0])[0]


class OpenAIPenalties(LogitsProcessor):
    """Presence and frequency penalties over the generated tokens, as OpenAI and vLLM state them."""

    def __init__(self, prompt_len: int, frequency: float, presence: float) -> None:
        self.prompt_len, self.frequency, self.presence = prompt_len, frequency, presence

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        generated = input_ids[:, self.prompt_len :]
        counts = torch.zeros_like(scores).scatter_add_(1, generated, torch.ones_like(generated, dtype=scores.dtype))
        return scores - (self.frequency * counts + self.presence * (counts > 0))


@pytest.fixture(scope="module")
def hf_penalized(llama_dir):
    model = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None

    def generate(prompt: list[int], params: SamplingParams) -> list[int]:
        processors = LogitsProcessorList(
            [OpenAIPenalties(len(prompt), params.frequency_penalty, params.presence_penalty)]
        )
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt]),
                max_new_tokens=params.max_tokens,
                do_sample=False,
                repetition_penalty=params.repetition_penalty,
                logits_processor=processors,
                pad_token_id=0,
            )
        return out[0, len(prompt) :].tolist()

    return generate


PENALTIES = [
    dict(repetition_penalty=1.5),
    dict(frequency_penalty=0.8),
    dict(presence_penalty=1.2),
    dict(repetition_penalty=1.2, frequency_penalty=0.3, presence_penalty=0.5),
]


def test_penalties_change_greedy_output_as_transformers_does(llama_dir, hf_penalized):
    prompt = [(11 * i) % 900 + 5 for i in range(7)]
    plain = alone(llama_dir, prompt, greedy(24))
    assert len(set(plain)) < len(plain)  # the tiny model repeats itself: the penalties have work
    for penalties in PENALTIES:
        params = greedy(24, **penalties)
        ours = alone(llama_dir, prompt, params)
        assert ours == hf_penalized(prompt, params), penalties
        assert ours != plain


def test_penalties_hold_through_preemptions_and_reused_slots(llama_dir, hf_penalized):
    """A small pool preempts; requests end at different times, so later ones take freed penalty
    slots while steps of the old holders may still be in flight. Each gets transformers' tokens."""
    rng = random.Random(3)
    requests = [
        ([rng.randrange(5, 900) for _ in range(10)], greedy(rng.randrange(8, 28), **PENALTIES[i % 4])) for i in range(7)
    ]
    arrivals = [0, 0, 1, 3, 6, 14, 22]
    engine = new_engine(llama_dir, num_kv_blocks=14)  # preempts penalized requests after outputs
    engine.submit("plain", [rng.randrange(5, 900) for _ in range(10)], greedy(20))  # no penalty: no slot
    slots, preempted = set(), 0
    launch = engine.runner.launch

    def recording_launch(seqs, masks=None):
        slots.update(s.rules.slot for s in seqs if s.rules is not None)
        return launch(seqs, masks)

    engine.runner.launch = recording_launch
    for step in range(10_000):
        for i, (prompt, params) in enumerate(requests):
            if arrivals[i] == step:
                assert engine.submit(f"r{i}", prompt, params) is None
        if step > max(arrivals) and not engine.busy:
            break
        preempted += len(engine.step().dropped)
    assert preempted > 0
    assert len(slots) < len(requests) and -1 not in slots  # freed slots were handed out again
    for i, (prompt, params) in enumerate(requests):
        assert engine.outputs[f"r{i}"] == hf_penalized(prompt, params)


def test_a_resubmitted_request_counts_the_outputs_it_had(llama_dir):
    """Resubmitted with its first outputs (as after a crash downstream), a penalized request goes
    on as if it had never stopped: the outputs it had count toward its penalties."""
    prompt = [(7 * i) % 900 + 5 for i in range(6)]
    params = greedy(20, frequency_penalty=0.6, repetition_penalty=1.3)
    whole = alone(llama_dir, prompt, params)
    engine = new_engine(llama_dir)
    engine.submit("r", prompt, params, output_ids=whole[:8])
    engine.run()
    assert engine.outputs["r"] == whole[8:]


def test_masks_bias_and_min_tokens_hold_at_every_token(llama_dir):
    prompt = [(13 * i) % 900 + 5 for i in range(9)]
    plain = alone(llama_dir, prompt, greedy(16))
    allowed = [3, 77, 500, 901]
    for params in (
        greedy(16, allowed_token_ids=allowed),
        SamplingParams(max_tokens=16, temperature=1.0, seed=5, allowed_token_ids=allowed, ignore_eos=True),
    ):
        assert set(alone(llama_dir, prompt, params)) <= set(allowed)
    banned = sorted(set(plain))
    assert not set(alone(llama_dir, prompt, greedy(16, disallowed_token_ids=banned))) & set(banned)
    assert alone(llama_dir, prompt, greedy(6, logit_bias={321: 100.0})) == [321] * 6

    # EOS is the second token drawn: min_tokens keeps it away until then.
    engine = new_engine(llama_dir)
    engine.batch.eos_token_ids = frozenset([plain[1]])
    engine.submit("early", prompt, SamplingParams(max_tokens=16, temperature=0.0))
    engine.submit("held", prompt, SamplingParams(max_tokens=16, temperature=0.0, min_tokens=5))
    engine.run()
    assert engine.outputs["early"] == plain[:2] and engine.finish_reasons["early"] == "stop"
    held = engine.outputs["held"]
    assert plain[1] not in held[:5] and len(held) > 5


def test_seeded_draws_with_rules_do_not_depend_on_the_batch(llama_dir):
    prompt = [(17 * i) % 900 + 5 for i in range(8)]
    params = SamplingParams(
        max_tokens=20,
        temperature=0.9,
        top_k=50,
        seed=1234,
        ignore_eos=True,
        presence_penalty=0.7,
        logit_bias={10: 3.0, 11: -2.0},
        disallowed_token_ids=[12, 13],
        min_tokens=4,
    )
    expected = alone(llama_dir, prompt, params)
    rng = random.Random(0)
    companions = [
        (
            [rng.randrange(5, 900) for _ in range(rng.randrange(3, 12))],
            greedy(rng.randrange(5, 25), presence_penalty=0.3),
        )
        for _ in range(4)
    ]
    for arrivals in ([0, 0, 1, 2, 3], [4, 0, 0, 0, 9]):
        outputs = run(new_engine(llama_dir, num_kv_blocks=24), [(prompt, params)] + companions, arrivals)
        assert outputs[0] == expected


def test_the_temperature_follows_its_schedule(llama_dir):
    params = SamplingParams(max_tokens=8, temperature=1.0, final_temperature=0.2, temperature_schedule_tokens=4, seed=9)
    assert [temperature_at(params, i) for i in range(6)] == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2, 0.2])
    assert temperature_at(SamplingParams(temperature=0.7), 50) == 0.7
    engine = new_engine(llama_dir)
    seen = {}
    launch = engine.runner.launch

    def recording_launch(seqs, masks=None):
        seen.update((s.output_index, s.temperature) for s in seqs if s.sample)
        return launch(seqs, masks)

    engine.runner.launch = recording_launch
    engine.submit("r", [5, 6, 7], params)
    engine.run()
    assert [seen[i] for i in range(8)] == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2, 0.2, 0.2, 0.2])


def test_freed_rule_slots_are_handed_out_lowest_first():
    slots = FreeSlots()
    assert [slots.take() for _ in range(3)] == [0, 1, 2]
    slots.give_back(2)
    slots.give_back(0)
    assert [slots.take(), slots.take(), slots.take()] == [0, 2, 3]


@pytest.mark.parametrize(
    "field, params",
    [
        ("logit_bias", dict(logit_bias={1024: 1.0})),
        ("allowed_token_ids", dict(allowed_token_ids=[5, 4096])),
        ("allowed_token_ids", dict(allowed_token_ids=[])),
        ("disallowed_token_ids", dict(disallowed_token_ids=[2**31 - 1])),
        ("disallowed_token_ids", dict(allowed_token_ids=[5, 6], disallowed_token_ids=[6, 5])),
        ("disallowed_token_ids", dict(disallowed_token_ids=list(range(1024)))),
    ],
)
def test_bad_token_ids_are_refused_naming_the_field(llama_dir, field, params):
    engine = new_engine(llama_dir)
    assert engine.runner.vocab_size == 1024
    error = engine.submit("r", [5, 6, 7], greedy(4, **params))
    assert error is not None and error.code == "invalid_request" and error.param == field
    assert engine.submit("ok", [5, 6, 7], greedy(4, logit_bias={1023: 1.0}, allowed_token_ids=[1023])) is None


@pytest.mark.gpu
@needs_cuda
def test_on_cuda_rules_hold_through_graphs_overlap_and_the_sampler_kernel(tmp_path):
    """Decodes replay CUDA graphs, steps overlap, sampled rows go through the sampler kernel: the
    greedy penalized requests get transformers' tokens (float32 on the same GPU), masks hold, and a
    seeded request with rules draws the same tokens alone and among 40 others."""
    model_dir = build_model_dir(tmp_path / "llama", arch="llama", size="hd128", seed=5)
    runner = ModelRunner(model_dir, device="cuda", dtype="float32", num_kv_blocks=600, block_size=16)
    assert runner.graphs is not None
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    hf.generation_config.eos_token_id = None
    rng = random.Random(7)
    allowed = sorted(rng.sample(range(runner.vocab_size), 40))
    seeded = SamplingParams(
        max_tokens=24, temperature=0.8, top_p=0.9, seed=11, ignore_eos=True, repetition_penalty=1.3, logit_bias={9: 5.0}
    )
    requests = [([rng.randrange(5, 900) for _ in range(rng.randrange(4, 40))], seeded)]
    for i in range(40):
        prompt = [rng.randrange(5, 900) for _ in range(rng.randrange(4, 40))]
        if i % 2:
            params = SamplingParams(
                max_tokens=20, temperature=1.0, top_k=20, seed=i, allowed_token_ids=allowed, ignore_eos=True
            )
        else:
            params = greedy(20, **PENALTIES[i // 2 % 4])
        requests.append((prompt, params))
    outputs = run(InProcessEngine(runner, max_prefill_tokens=256), requests, [0] * 41)
    assert outputs[0] == run(InProcessEngine(runner), requests[:1], [0])[0]
    for (prompt, params), output in zip(requests[1:], outputs[1:]):
        if params.allowed_token_ids:
            assert len(output) == 20 and set(output) <= set(allowed)
            continue
        processors = LogitsProcessorList(
            [OpenAIPenalties(len(prompt), params.frequency_penalty, params.presence_penalty)]
        )
        with torch.no_grad():
            reference = hf.generate(
                torch.tensor([prompt], device="cuda"),
                max_new_tokens=20,
                do_sample=False,
                repetition_penalty=params.repetition_penalty,
                logits_processor=processors,
                pad_token_id=0,
            )[0, len(prompt) :].tolist()
        assert output == reference
