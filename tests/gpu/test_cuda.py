"""The same model and sampler on a CUDA device: float32 agrees with the CPU, bf16 stays close."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from gpu.forward_batch import ForwardBatch
from gpu.runner import ModelRunner
from gpu.sampler import SamplingTensors, sample, uniform_noise
from gpu.sampler_kernel import sample_on_gpu
from tests.devices import needs_cuda
from tests.gpu.decoding import BLOCK_SIZE, NUM_BLOCKS, generate, random_prompt, shuffled_tables

pytestmark = [
    pytest.mark.gpu,
    needs_cuda,
]


def cuda_runner(model_dir, dtype):
    return ModelRunner(model_dir, device="cuda", dtype=dtype, num_kv_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE)


def test_float32_on_cuda_decodes_as_on_cpu(tiny_model_dir):
    prompts = [random_prompt(n, seed=n) for n in (7, 20, 33)]
    cpu = ModelRunner(tiny_model_dir, num_kv_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE)
    expected = generate(cpu, prompts, 30, chunk_size=7, arrivals=[0, 1, 2])
    assert generate(cuda_runner(tiny_model_dir, "float32"), prompts, 30, chunk_size=7, arrivals=[0, 1, 2]) == expected


def test_bfloat16_rounding_error_is_no_worse_than_transformers(tiny_model_dir):
    """bf16 moves logits by up to ~25% of their spread on these random models (Qwen2's biases the
    most); what matters is that our kernels add no error beyond what transformers' bf16 run has."""
    prompts = [random_prompt(n, seed=n) for n in (7, 20, 33)]
    batch = ForwardBatch.build(prompts, [0, 0, 0], shuffled_tables([7, 20, 33], seed=1), BLOCK_SIZE, "cuda")
    ours, theirs = {}, {}
    for dtype in (torch.float32, torch.bfloat16):
        runner = cuda_runner(tiny_model_dir, dtype)
        hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=dtype).cuda().eval()
        with torch.inference_mode():
            ours[dtype] = runner.model(batch, runner.kv)
            theirs[dtype] = torch.stack([hf(torch.tensor([p]).cuda()).logits[0, -1].float() for p in prompts])
    assert ours[torch.bfloat16].dtype == torch.float32
    our_error = (ours[torch.bfloat16] - ours[torch.float32]).abs().max().item()
    their_error = (theirs[torch.bfloat16] - theirs[torch.float32]).abs().max().item()
    assert our_error < 1.5 * their_error
    assert torch.equal(ours[torch.bfloat16].argmax(-1), ours[torch.float32].argmax(-1))


def test_auto_dtype_and_default_pool_on_cuda(build_tiny_model):
    runner = ModelRunner(build_tiny_model("llama"), device="cuda")
    try:
        assert runner.dtype == torch.bfloat16
        free_bytes, total_bytes = torch.cuda.mem_get_info()
        pool_bytes = sum(layer.numel() * layer.element_size() for layer in runner.kv.layers)
        assert pool_bytes > 0.5 * total_bytes and free_bytes > 0.1 * total_bytes
        assert runner.step([]) == []
    finally:
        del runner
        torch.cuda.empty_cache()


def test_sampling_on_cuda_draws_what_the_cpu_draws():
    seeds, positions = list(range(-3, 29)), [p * 7 for p in range(32)]
    assert torch.equal(
        uniform_noise(torch.tensor(seeds).cuda(), torch.tensor(positions).cuda(), 3000).cpu(),
        uniform_noise(torch.tensor(seeds), torch.tensor(positions), 3000),
    )
    logits = torch.randn(32, 3000, generator=torch.Generator().manual_seed(0)) * 3
    args = ([0.9] * 32, [0.95] * 32, [40] * 32, [0.05] * 32, seeds, positions)
    on_cpu = sample(logits, SamplingTensors.from_lists(*args, device="cpu"))
    on_cuda = sample(logits.cuda(), SamplingTensors.from_lists(*args, device="cuda"))
    assert torch.equal(on_cuda.cpu(), on_cpu)
    on_the_kernel = sample_on_gpu(logits.cuda(), SamplingTensors.from_lists(*args, device="cuda"))
    assert torch.equal(on_the_kernel.cpu(), on_cpu)
