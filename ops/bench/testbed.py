"""What `python -m ops.bench` measures on: random weights of a real model shape in a ModelRunner on
the device, the ceilings its figures are judged against (measured first, in the same run), and the
run's conditions. The in-process workloads (inprocess.py) step it through the in-process engine; the
whole-system mode (system.py) writes its weights as a checkpoint, then frees it for the server.
"""

import argparse
import gc
import time

import numpy as np
import torch

from gpu.config import ModelConfig
from gpu.kv_cache import KVCache
from gpu.runner import ModelRunner
from kernel.actor import freeze_startup_objects
from ops.bench.ceilings import copy_bandwidth, gemm_flops
from ops.bench.records import Row
from ops.bench.report import Report
from ops.bench.shapes import SHAPES

# The engine's settings, in-process and (--mode http) the server's.
MAX_PREFILL_TOKENS = 8192
MAX_NUM_SEQS = 256


class Testbed:
    def __init__(self, args: argparse.Namespace, report: Report) -> None:
        self.args = args
        self.report = report
        self.device = torch.device(args.device)
        self.raw = SHAPES[args.model]
        self.config = ModelConfig.from_dict(self.raw)
        self.rng = np.random.default_rng(args.seed)  # every prompt's tokens, in the order workloads ask
        self.device_name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"

    def measure_ceilings(self) -> None:
        small = self.device.type != "cuda"  # a CPU run checks the benchmark itself, not the machine
        n = 256 if small else 8192  # a CPU without bf16 units takes seconds per 1024^3 product
        self.bandwidth = copy_bandwidth(self.device, (64 if small else 2048) << 20)
        self.gemm = gemm_flops(self.device, n)
        self.report.add(Row("ceiling: device copy (read + write)", f"{self.bandwidth / 1e12:.3f} TB/s", "", ""))
        self.report.add(Row(f"ceiling: bf16 GEMM {n}^3", f"{self.gemm / 1e12:.1f} TFLOP/s", "", ""))

    def build_runner(self, deterministic: bool = False) -> None:
        """The runner of the run's weights (the seed's); `deterministic`: with the batch-invariant kernels."""
        started = time.perf_counter()
        kv_bytes = int(self.args.kv_cache_gb * (1 << 30)) if self.args.kv_cache_gb else None
        self.runner = ModelRunner.with_random_weights(
            self.config,
            str(self.device),
            "bfloat16",
            seed=self.args.seed,
            kv_cache_bytes=kv_bytes or self._default_kv_bytes(),
            attention_backend=self.args.attention_backend,
            deterministic=deterministic,
        )
        self.setup_seconds = time.perf_counter() - started
        freeze_startup_objects()  # as every actor does after its start-up
        self.graphs_on = self.runner.graphs is not None
        storages = {
            p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in self.runner.model.parameters()
        }
        self.weight_bytes = sum(storages.values())
        # A decode step reads every weight but the embedding table, of which it gathers one row per
        # token (a tied table is read whole as the output head, so it counts then).
        embedding = self.runner.model.model.embed_tokens.weight
        self.decode_weight_bytes = self.weight_bytes - (
            0 if self.config.tie_word_embeddings else embedding.numel() * embedding.element_size()
        )
        cfg = self.config
        self.kv_bytes_per_token = KVCache.bytes_per_block(
            cfg.num_hidden_layers, 1, cfg.num_key_value_heads, cfg.head_dim, self.runner.dtype
        )
        for line in self.conditions():
            self.report.note(line)

    def _default_kv_bytes(self) -> int | None:
        if self.device.type != "cuda":
            return None
        # Leave room for transformers' own KV cache and activations in workload d.
        weights = 2 * parameter_count(self.config)
        free, _ = torch.cuda.mem_get_info(self.device)
        return int(free - weights - (12 << 30))

    def conditions(self) -> list[str]:
        try:
            import flashinfer

            fi = flashinfer.__version__
        except ImportError:
            fi = "absent"
        return [
            f"device: {self.device_name}; torch {torch.__version__}; flashinfer {fi}",
            f"model: {self.args.model} shape, random bf16 weights ({self.weight_bytes / 1e9:.2f} GB), "
            f"attention {self.runner.attention_backend_name}, CUDA graphs {'on' if self.graphs_on else 'off'}, "
            f"{'deterministic, ' if self.runner.deterministic else ''}"
            f"block size {self.runner.block_size}, {self.runner.num_kv_blocks} KV blocks, "
            f"prefill budget {MAX_PREFILL_TOKENS} tokens/step, {self.args.sampling.describe()}",
            f"setup (weights, KV pool, graph capture): {self.setup_seconds:.1f} s",
        ]

    def prompt(self, length: int) -> list[int]:
        return self.rng.integers(0, self.config.vocab_size, length).tolist()

    def release_runner(self) -> None:
        """Frees the KV pool and graphs (transformers needs the memory); the weights stay."""
        self.runner.memory.release({"kv_cache"})
        self._empty_cache()

    def free(self) -> None:
        """Frees everything the runner holds on the device, weights included (for the server's executor)."""
        self.runner = None
        self._empty_cache()

    def _empty_cache(self) -> None:
        """Collects what was let go, the runner's objects frozen with the rest of the set-up included,
        then freezes what is left again (it lives on: the next workload runs in this process)."""
        gc.unfreeze()
        freeze_startup_objects()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def parameter_count(c: ModelConfig) -> int:
    """Parameters of a config's model (norms aside), to size memory before the model exists."""
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    layer = (q + 2 * kv) * c.hidden_size + q * c.hidden_size + 3 * c.intermediate_size * c.hidden_size
    embeddings = c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)
    return layer * c.num_hidden_layers + embeddings
