"""The Hugging Face transformers baseline of the throughput benchmark: its own model classes, running
on the very tensors of our model (no second copy of the weights), through batched `generate`.
"""

import time

import torch
import transformers

from gpu.kv_cache import KVCache
from gpu.model import CausalLM
from ops.bench.records import HfFigures
from ops.bench.requests import Sampling


def hf_model_sharing_weights(model: CausalLM, raw_config: dict) -> transformers.PreTrainedModel:
    """transformers' model of `raw_config`'s architecture whose parameters are `model`'s tensors."""
    architecture = raw_config["architectures"][0]
    config_class = getattr(transformers, architecture.replace("ForCausalLM", "Config"))
    fields = {k: v for k, v in raw_config.items() if k != "architectures"}
    config = config_class(**fields)
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        hf = getattr(transformers, architecture)(config)
    wanted = dict(hf.state_dict())
    ours = {name: tensor for name, tensor in model.state_dict().items() if name in wanted}
    missing = sorted(wanted.keys() - ours.keys())
    if missing:
        raise ValueError(f"our model lacks {missing[:5]} that transformers' {architecture} has")
    hf.load_state_dict(ours, assign=True, strict=False)
    device = next(model.parameters()).device
    # The rotary tables are buffers computed at construction: build them for real on the device.
    with torch.device(device):
        hf.model.rotary_emb = type(hf.model.rotary_emb)(config=hf.config)
    still_meta = [name for name, t in [*hf.named_parameters(), *hf.named_buffers()] if t.is_meta]
    if still_meta:
        raise ValueError(f"transformers' model still has tensors without data: {still_meta[:5]}")
    hf.generation_config.eos_token_id = None  # the workload ignores EOS, as ours does with ignore_eos
    hf.generation_config.pad_token_id = 0
    return hf.eval()


def left_padded(prompts: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask of `prompts` padded on the left to the longest: [B, width] each."""
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    return ids.to(device), mask.to(device)


def without_cudnn_attention():
    """A context in which torch's SDPA picks any kernel but cuDNN's. On the H100 torch picks cuDNN
    attention, which builds an execution plan for every new key length: each decode step of
    `generate` is a new length, so each paid that build (143 ms a step on cold shapes against 45 ms
    without cuDNN, qwen3-0.6b shape, batch 8, H100, 2026-11-24)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def batch_size_that_fits(requests: int, tokens_per_request: int, kv_bytes_per_token: int, free_bytes: int) -> int:
    """How many requests of `tokens_per_request` (prompt + output) one `generate` batch can hold:
    their KV cache within half of `free_bytes` (the rest for activations and the cache's regrowth),
    the batches as even as that allows."""
    fits = max(1, free_bytes // 2 // (kv_bytes_per_token * tokens_per_request))
    batches = -(-requests // fits)
    return -(-requests // batches)


def generate_kwargs(sampling: Sampling) -> dict:
    """The arguments of transformers' `generate` that make it draw tokens as `sampling` says."""
    if sampling.temperature <= 0:
        return {"do_sample": False}
    return {
        "do_sample": True,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": max(sampling.top_k, 0),
        "min_p": sampling.min_p or None,
    }  # our -1 is off, their 0


def hf_generate(
    hf: transformers.PreTrainedModel, prompts: list[list[int]], output_lens: list[int], sampling: Sampling = Sampling()
) -> HfFigures:
    """Batched `generate` of every prompt, in order, as many at once as fit: each batch
    left-padded to its longest prompt and run to its longest output. Returns seconds, the batch
    size, the output tokens the requests asked for, and the tokens generated."""
    device = next(hf.parameters()).device
    batch = len(prompts)
    if device.type == "cuda":
        config = hf.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        kv_bytes_per_token = KVCache.bytes_per_block(
            config.num_hidden_layers, 1, config.num_key_value_heads, head_dim, hf.dtype
        )
        free_bytes, _ = torch.cuda.mem_get_info(device)
        batch = batch_size_that_fits(
            len(prompts), max(map(len, prompts)) + max(output_lens), kv_bytes_per_token, free_bytes
        )

    def generate(batch_prompts: list[list[int]], new_tokens: int) -> int:
        """Runs one batch; returns the tokens it generated."""
        ids, mask = left_padded(batch_prompts, device)
        with torch.inference_mode(), without_cudnn_attention():
            out = hf.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, **generate_kwargs(sampling)
            )
        return (out.shape[1] - ids.shape[1]) * len(batch_prompts)

    generate(prompts[:batch], 2)  # a warm-up
    _sync(device)
    started = time.perf_counter()
    generated = sum(
        generate(prompts[i : i + batch], max(output_lens[i : i + batch])) for i in range(0, len(prompts), batch)
    )
    _sync(device)
    return HfFigures(time.perf_counter() - started, batch, useful_tokens=sum(output_lens), generated_tokens=generated)


def hf_diagnose(hf: transformers.PreTrainedModel, prompts: list[list[int]], new_tokens: int = 16) -> list[str]:
    """Where transformers' decode step goes: seconds per step of `generate` and of a plain forward
    loop over the same left-padded batch (with its KV cache), and generate's top operators."""
    device = next(hf.parameters()).device
    ids, mask = left_padded(prompts, device)

    def run_generate(n: int) -> float:
        _sync(device)
        started = time.perf_counter()
        with torch.inference_mode(), without_cudnn_attention():
            hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, do_sample=False)
        _sync(device)
        return time.perf_counter() - started

    def run_loop(n: int) -> float:
        _sync(device)
        started = time.perf_counter()
        with torch.inference_mode(), without_cudnn_attention():
            step_mask = mask
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            out = hf(input_ids=ids, attention_mask=step_mask, position_ids=positions, use_cache=True, logits_to_keep=1)
            cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            for _ in range(n - 1):
                step_mask = torch.cat([step_mask, torch.ones_like(token)], dim=1)
                positions = positions[:, -1:] + 1
                out = hf(
                    input_ids=token,
                    attention_mask=step_mask,
                    position_ids=positions,
                    past_key_values=cache,
                    use_cache=True,
                )
                cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        _sync(device)
        return time.perf_counter() - started

    run_generate(2)
    per_generate_step = (run_generate(1 + new_tokens) - run_generate(1)) / new_tokens
    run_loop(2)
    per_loop_step = (run_loop(1 + new_tokens) - run_loop(1)) / new_tokens
    lines = [
        f"transformers decode step, batch {len(prompts)}: generate {per_generate_step * 1e3:.1f} ms, "
        f"plain forward loop {per_loop_step * 1e3:.1f} ms"
    ]
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        run_generate(4)
    averages = prof.key_averages()
    lines.append(averages.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=50))
    if device.type == "cuda":
        lines.append(averages.table(sort_by="self_cuda_time_total", row_limit=8, max_name_column_width=50))
    return lines
