"""Embeddings on a CUDA device, through the in-process engine with its CUDA graphs: in float32 they
equal transformers' pooled last hidden states; in bf16 they are no further from the float32 ones than
transformers' own bf16 run is. A one-token embedding among decodes runs outside the decode graphs
(which keep no last layer) and still pools its token."""

import numpy as np
import pytest
import torch
from transformers import AutoModel

from actors.inprocess import InProcessEngine
from gpu.runner import ModelRunner
from schemas.generate import SamplingParams
from tests.devices import needs_cuda
from tests.gpu.decoding import random_prompt

pytestmark = [pytest.mark.gpu, needs_cuda]

PREFILL_BUDGET = 16
LENGTHS = (1, 7, 3 * PREFILL_BUDGET + 5, 20)


def embed_on_cuda(model_dir, dtype, pooling: str, prompts: list[list[int]]) -> list[np.ndarray]:
    runner = ModelRunner(model_dir, device="cuda", dtype=dtype, num_kv_blocks=64, block_size=16)
    engine = InProcessEngine(runner, max_prefill_tokens=PREFILL_BUDGET)
    engine.submit("decoding", random_prompt(9, seed=1), SamplingParams(max_tokens=40, temperature=0.0))

    def arrive(step: int) -> None:  # the embeddings join while the other request decodes
        if 2 <= step < 2 + len(prompts):
            assert (
                engine.submit(f"e{step - 2}", prompts[step - 2], SamplingParams(max_tokens=0), pooling=pooling) is None
            )

    engine.run(arrive, min_steps=2 + len(prompts))
    return [engine.embeddings[f"e{i}"] for i in range(len(prompts))]


def transformers_pooled(model_dir, dtype, device: str, pooling: str, prompts: list[list[int]]) -> list[np.ndarray]:
    model = AutoModel.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    pooled = []
    with torch.no_grad():
        for prompt in prompts:
            states = model(torch.tensor([prompt], device=device)).last_hidden_state[0].float()
            pooled.append((states[-1] if pooling == "last" else states.mean(dim=0)).cpu().numpy())
    return pooled


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_float32_on_cuda_equals_transformers(tiny_model_dir, pooling):
    prompts = [random_prompt(n, seed=n) for n in LENGTHS]
    ours = embed_on_cuda(tiny_model_dir, "float32", pooling, prompts)
    theirs = transformers_pooled(tiny_model_dir, torch.float32, "cpu", pooling, prompts)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_bfloat16_error_is_no_worse_than_transformers(tiny_model_dir, pooling):
    prompts = [random_prompt(n, seed=n) for n in LENGTHS]
    exact = transformers_pooled(tiny_model_dir, torch.float32, "cpu", pooling, prompts)
    ours = embed_on_cuda(tiny_model_dir, "bfloat16", pooling, prompts)
    theirs = transformers_pooled(tiny_model_dir, torch.bfloat16, "cuda", pooling, prompts)
    # One vector's largest error is one draw of bf16 rounding; the root mean square over every
    # prompt's unit vector measures the precision of the whole path.
    our_error = rms_error(ours, exact)
    their_error = rms_error(theirs, exact)
    assert our_error <= 1.5 * their_error + 1e-3, (our_error, their_error)


def rms_error(pooled: list[np.ndarray], exact: list[np.ndarray]) -> float:
    """Root mean square of the differences of unit vectors, over every element of every prompt."""
    unit = [v / np.linalg.norm(v) for v in pooled]
    exact_unit = [v / np.linalg.norm(v) for v in exact]
    return float(np.sqrt(np.mean(np.concatenate([(a - b) ** 2 for a, b in zip(unit, exact_unit)]))))
