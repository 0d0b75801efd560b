"""The transformers baseline of the throughput benchmark, on the CPU: transformers' model on our
model's very tensors, run in batches that fit."""

import torch

from gpu.config import ModelConfig
from gpu.runner import ModelRunner
from gpu.step_io import SequenceInput
from ops.bench.hf_baseline import batch_size_that_fits, generate_kwargs, hf_generate, hf_model_sharing_weights
from ops.bench.requests import Sampling
from ops.bench.shapes import SHAPES


def test_batches_hold_what_fits_in_half_the_memory_and_are_even():
    # llama-3.1-8b's 128 KiB of KV a token, 2048 tokens a request, 62 GiB free: 124 fit, so 3 batches.
    assert batch_size_that_fits(256, 2048, 128 << 10, 62 << 30) == 86
    assert batch_size_that_fits(256, 2048, 128 << 10, 1 << 40) == 256
    assert batch_size_that_fits(3, 2048, 128 << 10, 1 << 20) == 1  # never less than one


def test_transformers_draws_our_greedy_tokens_from_our_weights():
    raw = SHAPES["toy-llama"]
    runner = ModelRunner.with_random_weights(ModelConfig.from_dict(raw), device="cpu", num_kv_blocks=16, block_size=16)
    hf = hf_model_sharing_weights(runner.model, raw)
    prompt = [5, 9, 200, 17, 44, 3, 90]
    ours = [runner.step([SequenceInput(prompt, 0, [0], sample=True)])[0]]
    for i in range(3):
        ours += runner.step([SequenceInput([ours[-1]], len(prompt) + i, [0], sample=True)])
    with torch.inference_mode():
        theirs = hf.generate(torch.tensor([prompt]), max_new_tokens=4, do_sample=False)[0, len(prompt) :].tolist()
    assert theirs == ours

    result = hf_generate(hf, [prompt, prompt[:3], prompt[:5]], [4, 2, 6])
    assert result.batch_size == 3  # on the CPU, one batch
    assert result.useful_tokens == 12 and result.generated_tokens == 3 * 6
    assert result.seconds > 0


def test_transformers_samples_as_the_benchmark_asks():
    """With the benchmark's sampling, transformers draws from the same head: with top-k 1 that is
    our greedy token, whatever the temperature."""
    raw = SHAPES["toy-llama"]
    runner = ModelRunner.with_random_weights(ModelConfig.from_dict(raw), device="cpu", num_kv_blocks=16, block_size=16)
    hf = hf_model_sharing_weights(runner.model, raw)
    prompt = [5, 9, 200, 17, 44, 3, 90]
    torch.manual_seed(0)  # transformers draws from torch's global generator
    with torch.inference_mode():
        greedy = hf.generate(torch.tensor([prompt]), max_new_tokens=6, **generate_kwargs(Sampling()))
        top_1 = hf.generate(torch.tensor([prompt]), max_new_tokens=6, **generate_kwargs(Sampling(1.5, 0.9, 1)))
        spread = [
            hf.generate(torch.tensor([prompt]), max_new_tokens=6, **generate_kwargs(Sampling(2.0))) for _ in range(4)
        ]
    assert torch.equal(top_1, greedy)
    assert any(not torch.equal(drawn, greedy) for drawn in spread)  # it does sample
