"""Benchmarks of the GPU path on a random-weight model of a real shape, through the in-process engine
(the scheduler's batcher and the executor's batch, no bus), judged against ceilings measured in the
same run. Prints one table.

    python -m ops.bench --model llama-3.1-8b [--workloads a,b,c,d] [--hf-requests 32]

a: batch-1 decode at 1K context: inter-token latency vs (weights read + KV bytes) / copy bandwidth,
   where the weights read exclude the (untied) embedding table, of which a step gathers one row
b: batch-256 decode at 1K context: step time vs the same bound
c: prefill of 2K-token prompts: achieved TFLOP/s vs a bf16 matrix product's
d: offline throughput, prompt and output lengths uniform in [100, 1024], ignore_eos, greedy; and
   transformers' batched generate on the first --hf-requests of the same requests
"""

import argparse
import gc
import json
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

from actors.executor.inprocess import InProcessEngine
from gpu.config import ModelConfig
from gpu.runner import ModelRunner
from ops.ceilings import copy_bandwidth, gemm_flops
from ops.shapes import SHAPES
from schemas.generate import SamplingParams

MAX_PREFILL_TOKENS = 8192


@dataclass
class Row:
    workload: str
    measured: str
    bound: str
    ratio: str
    target: str = ""


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.device = torch.device(args.device)
        self.raw = SHAPES[args.model]
        self.config = ModelConfig.from_dict(self.raw)
        self.rng = np.random.default_rng(args.seed)
        self.rows: list[Row] = []

    # -- setup ------------------------------------------------------------------------------

    def measure_ceilings(self) -> None:
        small = self.device.type != "cuda"  # a CPU run checks the benchmark itself, not the machine
        n = 1024 if small else 8192
        self.bandwidth = copy_bandwidth(self.device, (64 if small else 2048) << 20)
        self.gemm = gemm_flops(self.device, n)
        self.add(Row("ceiling: device copy (read + write)", f"{self.bandwidth / 1e12:.3f} TB/s", "", ""))
        self.add(Row(f"ceiling: bf16 GEMM {n}^3", f"{self.gemm / 1e12:.1f} TFLOP/s", "", ""))

    def build_runner(self) -> None:
        started = time.perf_counter()
        kv_bytes = int(self.args.kv_cache_gb * (1 << 30)) if self.args.kv_cache_gb else None
        self.runner = ModelRunner.with_random_weights(self.config, str(self.device), "bfloat16", seed=self.args.seed,
                                                      kv_cache_bytes=kv_bytes or self._default_kv_bytes())
        self.setup_seconds = time.perf_counter() - started
        self.graphs_on = self.runner.graphs is not None
        storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in self.runner.model.parameters()}
        self.weight_bytes = sum(storages.values())
        # A decode step reads every weight but the embedding table, of which it gathers one row per
        # token (a tied table is read whole as the output head, so it counts then).
        embedding = self.runner.model.model.embed_tokens.weight
        self.decode_weight_bytes = self.weight_bytes - (
            0 if self.config.tie_word_embeddings else embedding.numel() * embedding.element_size()
        )
        cfg = self.config
        self.kv_bytes_per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * 2
        self.runner_seconds: list[float] = []
        self.profiler = None  # a cProfile.Profile while a workload is profiled (--profile)
        step = self.runner.step

        def timed_step(seqs):
            if self.profiler is not None:
                self.profiler.enable()
            started = time.perf_counter()
            out = step(seqs)
            self.runner_seconds.append(time.perf_counter() - started)
            if self.profiler is not None:
                self.profiler.disable()
            return out

        self.runner.step = timed_step

    def _default_kv_bytes(self) -> int | None:
        if self.device.type != "cuda":
            return None
        # Leave room for transformers' own KV cache and activations in workload d.
        weights = 2 * parameter_count(self.config)
        free, _ = torch.cuda.mem_get_info(self.device)
        return int(free - weights - (12 << 30))

    def engine(self) -> InProcessEngine:
        return InProcessEngine(self.runner, max_num_seqs=256, max_prefill_tokens=MAX_PREFILL_TOKENS)

    def prompt(self, length: int) -> list[int]:
        return self.rng.integers(0, self.config.vocab_size, length).tolist()

    # -- workloads --------------------------------------------------------------------------

    def run_steps(self, engine: InProcessEngine, prompt_lens: dict[str, int]) -> list[dict]:
        """Steps until idle; per step: wall seconds, runner seconds, decodes, prefill tokens, KV tokens read."""
        steps = []
        while engine.busy:
            before = len(self.runner_seconds)
            started = time.perf_counter()
            output = engine.step()
            wall = time.perf_counter() - started
            decodes = [u for u in output.updates if u.prefilled_tokens == 0]
            steps.append({
                "wall": wall,
                "runner": self.runner_seconds[-1] if len(self.runner_seconds) > before else 0.0,
                "decodes": len(decodes),
                "prefill": sum(u.prefilled_tokens for u in output.updates),
                "kv_tokens": sum(prompt_lens[u.request_id] + u.output_index for u in decodes),
            })
        return steps

    def decode(self, name: str, batch: int, context: int, new_tokens: int, target: str) -> None:
        graphs = self.runner.graphs
        if graphs is not None:
            graphs.timings = []
        engine = self.engine()
        if self.args.profile:
            import cProfile

            self.profiler = cProfile.Profile()
        params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        lens = {}
        for i in range(batch):
            engine.submit(f"{name}-{i}", self.prompt(context), params)
            lens[f"{name}-{i}"] = context
        steps = [s for s in self.run_steps(engine, lens) if s["decodes"] == batch and s["prefill"] == 0]
        steps = steps[2:]  # the first decode steps after a prefill warm the allocator
        if self.profiler is not None:
            import pstats

            print(f"-- {name}: where ModelRunner.step spends host time (all steps, prefill included)", flush=True)
            pstats.Stats(self.profiler).sort_stats("tottime").print_stats(18)
            self.profiler = None
        wall = statistics.median(s["wall"] for s in steps)
        runner = statistics.median(s["runner"] for s in steps)
        kv_tokens = statistics.median(s["kv_tokens"] for s in steps)
        bound = (self.decode_weight_bytes + kv_tokens * self.kv_bytes_per_token) / self.bandwidth
        label = f"{name}: batch-{batch} decode, {context} ctx, step"
        self.add(Row(label, f"{wall * 1e3:.2f} ms", f"{bound * 1e3:.2f} ms", f"{wall / bound:.2f}x", target))
        self.add(Row(f"{name}:   of which ModelRunner.step", f"{runner * 1e3:.2f} ms", f"{bound * 1e3:.2f} ms",
                     f"{runner / bound:.2f}x"))
        size = graphs.padded_size(batch) if graphs else None
        gpu = None
        if size is not None:
            torch.cuda.synchronize()
            replays = [start.elapsed_time(end) / 1e3 for s, start, end in graphs.timings if s == size][2:]
            graphs.timings = None
            gpu = statistics.median(replays)
            self.add(Row(f"{name}:   of which GPU (graph replay, events)", f"{gpu * 1e3:.2f} ms",
                         f"{bound * 1e3:.2f} ms", f"{gpu / bound:.2f}x"))
        self.details[name] = {"steps": len(steps), "wall_s": wall, "runner_s": runner, "gpu_s": gpu, "bound_s": bound,
                              "kv_tokens": kv_tokens, "weight_bytes_read": self.decode_weight_bytes}

    def prefill(self, name: str, prompt_len: int, count: int) -> None:
        params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
        warm = self.engine()
        for i in range(2):
            warm.submit(f"warm-{i}", self.prompt(prompt_len), params)
        warm.run()
        engine = self.engine()
        for i in range(count):
            engine.submit(f"{name}-{i}", self.prompt(prompt_len), params)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        engine.run()
        seconds = time.perf_counter() - started
        cfg = self.config
        per_layer = (cfg.hidden_size * (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
                     + cfg.num_attention_heads * cfg.head_dim * cfg.hidden_size + 3 * cfg.hidden_size * cfg.intermediate_size)
        linear = 2 * per_layer * cfg.num_hidden_layers * prompt_len * count
        attention = 2 * cfg.num_attention_heads * cfg.head_dim * prompt_len**2 * cfg.num_hidden_layers * count  # causal
        head = 2 * cfg.hidden_size * cfg.vocab_size * count
        achieved = (linear + attention + head) / seconds
        self.add(Row(f"{name}: prefill {count} x {prompt_len}-token prompts", f"{achieved / 1e12:.1f} TFLOP/s",
                             f"{self.gemm / 1e12:.1f} TFLOP/s", f"{achieved / self.gemm:.2f}", ">= 0.60"))
        self.add(Row(f"{name}:   time, tokens/s", f"{seconds * 1e3:.0f} ms",
                             f"{prompt_len * count / seconds:,.0f} tok/s", ""))
        self.details[name] = {"seconds": seconds, "flop": linear + attention + head}

    def throughput(self, name: str, requests: int, hf_requests: int) -> None:
        # Lengths from their own generator: the same requests whatever ran before and whatever the model.
        lengths = np.random.default_rng(self.args.seed + 1).integers(100, 1025, size=(requests, 2))
        lens = [(int(p), int(o)) for p, o in lengths]
        prompts = [self.prompt(p) for p, _ in lens]
        engine = self.engine()
        for i, (prompt, (_, out_len)) in enumerate(zip(prompts, lens)):
            engine.submit(f"{name}-{i}", prompt, SamplingParams(max_tokens=out_len, temperature=0.0, ignore_eos=True))
        started = time.perf_counter()
        engine.run()
        seconds = time.perf_counter() - started
        produced = sum(map(len, engine.outputs.values()))
        ours = produced / seconds
        self.add(Row(f"{name}: offline, {requests} requests, ours", f"{ours:,.0f} out tok/s",
                             f"{seconds:.1f} s, {produced} tokens", ""))
        self.details[name] = {"seconds": seconds, "output_tokens": produced, "steps": engine.steps}
        if hf_requests <= 0:
            return
        from ops.hf_baseline import hf_generate, hf_model_sharing_weights

        model = self.runner.model
        del engine
        self.release_runner()
        hf = hf_model_sharing_weights(model, self.raw)
        picked = list(range(hf_requests))
        result = hf_generate(hf, [prompts[i] for i in picked], [lens[i][1] for i in picked])
        theirs = result["useful_tokens"] / result["seconds"]
        self.add(Row(
            f"{name}: transformers generate, first {hf_requests} requests, one batch",
            f"{theirs:,.0f} out tok/s", f"{result['seconds']:.1f} s, {result['useful_tokens']} tokens "
            f"({result['generated_tokens']} generated; first token {result['first_token_seconds']:.2f} s)",
            f"ours {ours / theirs:.1f}x",
        ))
        self.details[f"{name}-hf"] = result

    def diagnose_hf(self, name: str, count: int) -> None:
        from ops.hf_baseline import hf_diagnose, hf_model_sharing_weights

        hf = hf_model_sharing_weights(self.runner.model, self.raw)
        lens = self.rng.integers(100, 1025, size=count)
        for line in hf_diagnose(hf, [self.prompt(int(n)) for n in lens]):
            print(line, flush=True)

    def release_runner(self) -> None:
        """Frees the KV pool and graphs (transformers needs the memory); the weights stay."""
        self.runner.kv = self.runner.graphs = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # -- report -----------------------------------------------------------------------------

    def add(self, row: Row) -> None:
        """Keeps a row for the table and prints it at once, so a run cut short still reports."""
        self.rows.append(row)
        print(" | ".join(cell for cell in (row.workload, row.measured, row.bound, row.ratio, row.target) if cell),
              flush=True)

    def conditions(self) -> list[str]:
        gpu = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        try:
            import flashinfer

            fi = flashinfer.__version__
        except ImportError:
            fi = "absent"
        return [
            f"device: {gpu}; torch {torch.__version__}; flashinfer {fi}",
            f"model: {self.args.model} shape, random bf16 weights ({self.weight_bytes / 1e9:.2f} GB), "
            f"attention {self.runner.attention_backend_name}, CUDA graphs {'on' if self.graphs_on else 'off'}, "
            f"block size {self.runner.block_size}, {self.runner.num_kv_blocks} KV blocks, "
            f"prefill budget {MAX_PREFILL_TOKENS} tokens/step, greedy",
            f"setup (weights, KV pool, graph capture): {self.setup_seconds:.1f} s",
        ]

    def print_table(self) -> None:
        header = ("workload", "measured", "bound / ceiling / detail", "ratio", "target")
        rows = [header] + [(r.workload, r.measured, r.bound, r.ratio, r.target) for r in self.rows]
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        print()
        for line in self.conditions():
            print(line)
        for i, row in enumerate(rows):
            print("| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths)) + " |")
            if i == 0:
                print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


def parameter_count(c: ModelConfig) -> int:
    """Parameters of a config's model (norms aside), to size memory before the model exists."""
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    layer = (q + 2 * kv) * c.hidden_size + q * c.hidden_size + 3 * c.intermediate_size * c.hidden_size
    embeddings = c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)
    return layer * c.num_hidden_layers + embeddings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-3.1-8b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--workloads", default="a,b,c,d")
    parser.add_argument("--requests", type=int, default=256, help="requests of workload d")
    parser.add_argument("--hf-requests", type=int, default=32, help="of those, run through transformers (0: skip)")
    parser.add_argument("--decode-batch", type=int, default=256, help="batch of workload b")
    parser.add_argument("--context", type=int, default=1024, help="context of workloads a and b")
    parser.add_argument("--kv-cache-gb", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the details here")
    parser.add_argument("--profile", action="store_true", help="cProfile ModelRunner.step in workloads a and b")
    parser.add_argument("--kernel-profile", action="store_true", help="GPU time per kernel of a decode step")
    parser.add_argument("--hf-diagnose", type=int, default=0, help="time transformers' decode step at this batch")
    parser.add_argument("--compare-plan", action="store_true", help="run a also with FlashInfer's public plan()")
    args = parser.parse_args()
    workloads = set(args.workloads.split(","))

    bench = Bench(args)
    bench.details = {}
    bench.measure_ceilings()
    bench.build_runner()
    for line in bench.conditions():
        print(line, flush=True)
    if "a" in workloads:
        backend = bench.runner.model.attention_backend
        if args.compare_plan and hasattr(backend, "direct_graph_replan"):
            backend.direct_graph_replan = False  # FlashInfer's public plan() every step, for comparison
            bench.decode("a-public-plan", 1, args.context, 129, "")
            backend.direct_graph_replan = True
        bench.decode("a", 1, args.context, 129, "<= 6.0 ms (8B)")
        if args.kernel_profile and bench.device.type == "cuda":
            from ops.diagnostics import kernel_profile

            print(kernel_profile(bench.runner, args.context), flush=True)
    if "b" in workloads:
        bench.decode("b", args.decode_batch, args.context, 96, "<= 1.25x")
    if "c" in workloads:
        bench.prefill("c", 2048, 16)
    if args.hf_diagnose:
        bench.diagnose_hf("hf", args.hf_diagnose)
    if "d" in workloads:
        bench.throughput("d", args.requests, args.hf_requests)
    bench.print_table()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"conditions": bench.conditions(), "rows": [r.__dict__ for r in bench.rows],
                       "details": bench.details}, f, indent=2)


if __name__ == "__main__":
    main()
