"""Our model, driven through `ModelRunner.step`, decodes exactly what transformers decodes.

Paged KV with shuffled (non-contiguous) blocks, block boundaries crossed mid-prompt and mid-decode,
chunked prefill on top of cached KV, and batches mixing prefill and decode must all be invisible
in the output tokens.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM

from gpu.forward_batch import ForwardBatch
from gpu.runner import ModelRunner
from tests.gpu.decoding import BLOCK_SIZE, NUM_BLOCKS, generate, random_prompt, shuffled_tables


@pytest.fixture
def runner(tiny_model_dir):
    return ModelRunner(tiny_model_dir, device="cpu", num_kv_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE)


@pytest.mark.parametrize("chunk_size", [None, 7], ids=["one-chunk", "chunks-of-7"])
def test_greedy_decoding_matches(tiny_model_dir, runner, hf_greedy, chunk_size):
    prompt = random_prompt(20, seed=1)
    [output] = generate(runner, [prompt], 30, chunk_size=chunk_size, seed=2)
    assert output == hf_greedy(tiny_model_dir, prompt, 30)
    assert len(set(output)) > 5  # the comparison means something only if the model does not loop


@pytest.mark.parametrize(
    "chunk_size, arrivals",
    [(None, [0, 0, 0, 0]), (7, [0, 1, 3, 4])],
    ids=["prefilled-together", "staggered-chunked-prefill-beside-decodes"],
)
def test_batched_decoding_matches_each_alone(tiny_model_dir, runner, hf_greedy, chunk_size, arrivals):
    prompts = [random_prompt(n, seed=10 + n) for n in (5, 13, 20, 31)]
    outputs = generate(runner, prompts, 20, chunk_size=chunk_size, arrivals=arrivals, seed=3)
    for prompt, output in zip(prompts, outputs):
        assert output == hf_greedy(tiny_model_dir, prompt, 20)


def test_first_step_logits_match(tiny_model_dir, runner):
    prompts = [random_prompt(20, seed=1), random_prompt(9, seed=4)]
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = torch.stack([hf(torch.tensor([p])).logits[0, -1] for p in prompts])
    batch = ForwardBatch.build(prompts, [0, 0], shuffled_tables([20, 9], seed=5), BLOCK_SIZE, "cpu")
    with torch.inference_mode():
        logits = runner.model(batch, runner.kv)
    assert logits.dtype == torch.float32 and logits.shape == expected.shape
    assert (logits - expected).abs().max().item() < 1e-4
