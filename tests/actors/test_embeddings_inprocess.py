"""Embeddings through the batcher, the running batch and the runner in one process: the pooled final
hidden states equal transformers' (`AutoModel`'s last hidden state, which is after the final norm),
for a batch of mixed lengths with one prompt longer than the prefill budget (chunked), with last and
mean pooling; an embedding shares the prefix cache harmlessly; and embeddings that run beside
generations leave the generations' greedy tokens as they were."""

import random

import numpy as np
import pytest
import torch
from transformers import AutoModel

from actors.inprocess import InProcessEngine
from gpu.runner import ModelRunner
from schemas.generate import SamplingParams

TOLERANCE = 1e-5  # float32 on both sides; the sums of a chunked mean run in another order
PREFILL_BUDGET = 16


@pytest.fixture(scope="module")
def model_dir(build_tiny_model):
    return build_tiny_model("qwen3")


@pytest.fixture(scope="module")
def hidden_states(model_dir):
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()

    def last_layer(prompt: list[int]) -> np.ndarray:
        with torch.no_grad():
            return model(torch.tensor([prompt])).last_hidden_state[0].numpy()  # [tokens, hidden]

    return last_layer


def engine(model_dir) -> InProcessEngine:
    runner = ModelRunner(model_dir, device="cpu", num_kv_blocks=96, block_size=4)
    return InProcessEngine(runner, max_prefill_tokens=PREFILL_BUDGET)


def embed(eng: InProcessEngine, prompts: list[list[int]], pooling: str) -> list[np.ndarray]:
    for i, prompt in enumerate(prompts):
        assert eng.submit(f"e{i}", prompt, SamplingParams(max_tokens=0), pooling=pooling) is None
    eng.run()
    return [eng.embeddings[f"e{i}"] for i in range(len(prompts))]


def prompts_of(lengths: list[int], seed: int = 5) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, 200) for _ in range(n)] for n in lengths]


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_embeddings_equal_transformers_hidden_states(model_dir, hidden_states, pooling):
    lengths = [3, 9, 1, 3 * PREFILL_BUDGET + 5, 17]  # one over the prefill budget: three chunks and more
    prompts = prompts_of(lengths)
    eng = engine(model_dir)
    vectors = embed(eng, prompts, pooling)
    for prompt, vector in zip(prompts, vectors):
        states = hidden_states(prompt)
        expected = states[-1] if pooling == "last" else states.mean(axis=0)
        assert vector.shape == (eng.runner.config.hidden_size,)
        np.testing.assert_allclose(vector, expected, atol=TOLERANCE, rtol=TOLERANCE)
    assert eng.finish_reasons == {f"e{i}": "length" for i in range(len(prompts))}
    assert all(not tokens for tokens in eng.outputs.values())  # nothing drawn


def test_a_cached_prefix_serves_last_pooling_and_mean_pooling_recomputes(model_dir, hidden_states):
    """The second embedding of a prompt reads the first one's cached KV (last pooling needs only the
    last token computed); a mean needs every token's state, so it takes nothing from the cache."""
    prompt = prompts_of([26], seed=9)[0]
    eng = engine(model_dir)
    first = embed(eng, [prompt], "last")[0]
    eng.submit("again", prompt, SamplingParams(max_tokens=0), pooling="last")
    eng.submit("mean", prompt, SamplingParams(max_tokens=0), pooling="mean")
    eng.run()
    assert eng.cached_tokens["again"] > 0
    assert eng.cached_tokens["mean"] == 0
    np.testing.assert_allclose(eng.embeddings["again"], first, atol=TOLERANCE, rtol=TOLERANCE)
    np.testing.assert_allclose(eng.embeddings["mean"], hidden_states(prompt).mean(axis=0), atol=TOLERANCE)


def test_embeddings_beside_generations_leave_their_tokens_alone(model_dir):
    generations = prompts_of([7, 12, 30], seed=3)
    greedy = SamplingParams(max_tokens=12, temperature=0.0)

    def generate(with_embeddings: bool) -> dict[str, list[int]]:
        eng = engine(model_dir)
        for i, prompt in enumerate(generations):
            eng.submit(f"g{i}", prompt, greedy)
        embeddings = prompts_of([5, 40, 2 * PREFILL_BUDGET], seed=4)

        def arrive(step: int) -> None:
            if with_embeddings and step < len(embeddings):
                eng.submit(f"e{step}", embeddings[step], SamplingParams(max_tokens=0), pooling="mean")

        eng.run(arrive, min_steps=len(embeddings))
        if with_embeddings:
            assert len(eng.embeddings) == len(embeddings)
        return {rid: tokens for rid, tokens in eng.outputs.items() if rid.startswith("g")}

    alone = generate(False)
    assert all(len(tokens) == 12 for tokens in alone.values())
    assert generate(True) == alone
