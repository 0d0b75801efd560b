"""fp16 weights and KV cache, every architecture, on the CPU's torch backend: decoding tracks
transformers' own fp16 run on the same weights. (The CUDA backends' fp16 kernels are checked
against the torch path in test_triton_attention.py and test_kernels.py.)"""

import torch
from transformers import AutoModelForCausalLM

from gpu.runner import ModelRunner
from tests.gpu.decoding import BLOCK_SIZE, NUM_BLOCKS, assert_decoding_tracks, random_prompt


def test_float16_decoding_tracks_transformers(tiny_model_dir):
    runner = ModelRunner(tiny_model_dir, dtype="float16", num_kv_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE)
    assert runner.dtype == torch.float16 and all(layer.dtype == torch.float16 for layer in runner.kv.layers)
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float16).eval()
    hf.generation_config.eos_token_id = None
    prompts = [random_prompt(n, seed=n) for n in (5, 17, 40)]
    assert_decoding_tracks(runner, hf, prompts, 12)
