"""The benchmark's in-process workloads: the scheduler's batcher and the executor's batch stepped in
this process (no bus) on random weights of a real shape, each judged against the ceilings measured
in the same run. `ops.bench` runs them; `ops.bench.system` compares the whole system with them.
"""

import argparse
import gc
import statistics
import time

import numpy as np
import torch

from actors.inprocess import InProcessEngine
from gpu.config import ModelConfig
from gpu.kv_cache import KVCache
from gpu.runner import ModelRunner
from kernel.actor import freeze_startup_objects
from ops.bench.ceilings import copy_bandwidth, gemm_flops
from ops.bench.report import Report, Row, p50_p90_p99
from ops.bench.requests import BenchRequest, RequestTiming, summarize
from ops.bench.shapes import SHAPES

MAX_PREFILL_TOKENS = 8192
MAX_NUM_SEQS = 256


class InProcessBench:
    def __init__(self, args: argparse.Namespace, report: Report) -> None:
        self.args = args
        self.report = report
        self.device = torch.device(args.device)
        self.raw = SHAPES[args.model]
        self.config = ModelConfig.from_dict(self.raw)
        self.rng = np.random.default_rng(args.seed)
        self.device_name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"

    # -- setup ------------------------------------------------------------------------------

    def measure_ceilings(self) -> None:
        small = self.device.type != "cuda"  # a CPU run checks the benchmark itself, not the machine
        n = 256 if small else 8192  # a CPU without bf16 units takes seconds per 1024^3 product
        self.bandwidth = copy_bandwidth(self.device, (64 if small else 2048) << 20)
        self.gemm = gemm_flops(self.device, n)
        self.report.add(Row("ceiling: device copy (read + write)", f"{self.bandwidth / 1e12:.3f} TB/s", "", ""))
        self.report.add(Row(f"ceiling: bf16 GEMM {n}^3", f"{self.gemm / 1e12:.1f} TFLOP/s", "", ""))

    def build_runner(self) -> None:
        started = time.perf_counter()
        kv_bytes = int(self.args.kv_cache_gb * (1 << 30)) if self.args.kv_cache_gb else None
        self.runner = ModelRunner.with_random_weights(
            self.config, str(self.device), "bfloat16", seed=self.args.seed,
            kv_cache_bytes=kv_bytes or self._default_kv_bytes(), attention_backend=self.args.attention_backend,
        )
        self.setup_seconds = time.perf_counter() - started
        freeze_startup_objects()  # as every actor does after its start-up
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
        self.kv_bytes_per_token = KVCache.bytes_per_block(
            cfg.num_hidden_layers, 1, cfg.num_key_value_heads, cfg.head_dim, self.runner.dtype
        )
        self.profiler = None  # a cProfile.Profile while a workload is profiled (--profile)
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
            f"block size {self.runner.block_size}, {self.runner.num_kv_blocks} KV blocks, "
            f"prefill budget {MAX_PREFILL_TOKENS} tokens/step, {self.args.sampling.describe()}",
            f"setup (weights, KV pool, graph capture): {self.setup_seconds:.1f} s",
        ]

    def engine(self) -> InProcessEngine:
        return InProcessEngine(self.runner, max_num_seqs=MAX_NUM_SEQS, max_prefill_tokens=MAX_PREFILL_TOKENS)

    def prompt(self, length: int) -> list[int]:
        return self.rng.integers(0, self.config.vocab_size, length).tolist()

    def warm_up(self, requests: list[BenchRequest]) -> None:
        """Runs `requests` unmeasured, so first-use costs (kernel compilation, allocator growth)
        fall on no measured workload; the HTTP side gets the same requests first."""
        engine = self.engine()
        for i, request in enumerate(requests):
            engine.submit(f"warm-{i}", request.prompt_ids, self.args.sampling.params(request.output_tokens))
        engine.run()

    # -- workloads --------------------------------------------------------------------------

    def run_steps(self, engine: InProcessEngine, prompt_lens: dict[str, int]) -> list[dict]:
        """Steps until idle; per step: wall seconds, runner seconds, decodes, prefill tokens, KV tokens read.
        The engine overlaps steps: it launches step N+1 before it reads step N's tokens, so what the
        runner adds is the host time of a launch, spent while the GPU runs the step before."""
        steps = []
        while engine.busy:
            if self.profiler is not None:
                self.profiler.enable()
            started = time.perf_counter()
            output = engine.step()
            wall = time.perf_counter() - started
            if self.profiler is not None:
                self.profiler.disable()
            decodes = [u for u in output.updates if u.prefilled_tokens == 0]
            steps.append({
                "wall": wall,
                "runner": engine.launch_s,
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
        lens = {}
        for i in range(batch):
            engine.submit(f"{name}-{i}", self.prompt(context), self.args.sampling.params(new_tokens))
            lens[f"{name}-{i}"] = context
        steps = [s for s in self.run_steps(engine, lens) if s["decodes"] == batch and s["prefill"] == 0]
        steps = steps[2:]  # the first decode steps after a prefill warm the allocator
        if self.profiler is not None:
            import pstats

            print(f"-- {name}: where the engine's steps spend host time (all steps, prefill included; the wait "
                  "for a step's tokens is its one synchronize line)", flush=True)
            pstats.Stats(self.profiler).sort_stats("tottime").print_stats(18)
            self.profiler = None
        wall = statistics.median(s["wall"] for s in steps)
        runner = statistics.median(s["runner"] for s in steps)
        kv_tokens = statistics.median(s["kv_tokens"] for s in steps)
        bound = (self.decode_weight_bytes + kv_tokens * self.kv_bytes_per_token) / self.bandwidth
        label = f"{name}: batch-{batch} decode, {context} ctx, step"
        self.report.add(Row(label, f"{wall * 1e3:.2f} ms", f"{bound * 1e3:.2f} ms", f"{wall / bound:.2f}x", target))
        self.report.add(Row(f"{name}:   of which ModelRunner.launch (host, overlapped)", f"{runner * 1e3:.2f} ms", f"{bound * 1e3:.2f} ms",
                            f"{runner / bound:.2f}x"))
        size = graphs.padded_size(batch) if graphs else None
        gpu = None
        if size is not None:
            torch.cuda.synchronize()
            replays = [start.elapsed_time(end) / 1e3 for s, start, end in graphs.timings if s == size][2:]
            graphs.timings = None
            gpu = statistics.median(replays)
            self.report.add(Row(f"{name}:   of which GPU (graph replay, events)", f"{gpu * 1e3:.2f} ms",
                                f"{bound * 1e3:.2f} ms", f"{gpu / bound:.2f}x"))
        self.report.details[name] = {"steps": len(steps), "wall_s": wall, "runner_s": runner, "gpu_s": gpu,
                                     "bound_s": bound, "kv_tokens": kv_tokens,
                                     "weight_bytes_read": self.decode_weight_bytes}

    def prefill(self, name: str, prompt_len: int, count: int) -> None:
        params = self.args.sampling.params(1)
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
        self.report.add(Row(f"{name}: prefill {count} x {prompt_len}-token prompts", f"{achieved / 1e12:.1f} TFLOP/s",
                            f"{self.gemm / 1e12:.1f} TFLOP/s", f"{achieved / self.gemm:.2f}", ">= 0.60"))
        self.report.add(Row(f"{name}:   time, tokens/s", f"{seconds * 1e3:.0f} ms",
                            f"{prompt_len * count / seconds:,.0f} tok/s", ""))
        self.report.details[name] = {"seconds": seconds, "flop": linear + attention + head}

    def offline_requests(self, count: int, lengths: tuple[int, int]) -> list[BenchRequest]:
        """Workload d's requests. Lengths from their own generator: the same requests whatever ran
        before and whatever the model (the prompts' tokens come from the shared one)."""
        drawn = np.random.default_rng(self.args.seed + 1).integers(lengths[0], lengths[1] + 1, size=(count, 2))
        return [BenchRequest(self.prompt(int(p)), int(o)) for p, o in drawn]

    def throughput(self, name: str, requests: list[BenchRequest]) -> dict:
        """All of `requests` submitted at once and run to the end, each token timed when its step is
        booked, as a client would see it arrive; returns the details."""
        engine = self.engine()
        request_ids = [f"{name}-{i}" for i in range(len(requests))]
        for request_id, request in zip(request_ids, requests):
            engine.submit(request_id, request.prompt_ids, self.args.sampling.params(request.output_tokens))
        # Booking a step's arrivals costs tens of microseconds of host time, spent while the GPU runs
        # the step launched after it; keeping the step outputs to book later would hold them all
        # in memory for the garbage collector to walk.
        chunks: dict[str, list[tuple[float, int]]] = {request_id: [] for request_id in request_ids}
        started = time.perf_counter()
        while engine.busy:
            output = engine.step()
            booked = time.perf_counter()
            for update in output.updates:
                if update.token_ids:
                    chunks[update.request_id].append((booked, len(update.token_ids)))
        seconds = time.perf_counter() - started
        timings = [RequestTiming.from_chunks(started, chunks[request_id]) for request_id in request_ids]
        details = summarize(timings, seconds, len(requests), requests)
        details["steps"] = engine.steps
        self.report.add(Row(f"{name}: offline, {len(requests)} requests, ours", f"{details['output_tok_s']:,.0f} out tok/s",
                            f"{details['input_tok_s']:,.0f} in tok/s; {seconds:.1f} s, {details['output_tokens']} tokens", ""))
        self.report.add(Row(f"{name}:   TTFT p50 / p90 / p99", p50_p90_p99(details["ttft_ms"]), "", ""))
        self.report.add(Row(f"{name}:   ITL p50 / p90 / p99", p50_p90_p99(details["itl_ms"]), "", ""))
        self.report.details[name] = details
        return details

    def low_load(self, name: str, requests: list[BenchRequest]) -> dict:
        """One request at a time, each run to its end; TTFT is from the submit to the end of the
        step that drew the first token (that step's device work included: it ends in a sync)."""
        engine = self.engine()
        timings = []
        for i, request in enumerate(requests):
            request_id = f"{name}-{i}"
            started = time.perf_counter()
            engine.submit(request_id, request.prompt_ids, self.args.sampling.params(request.output_tokens))
            chunks, seen = [], 0
            while engine.busy:
                engine.step()
                produced = len(engine.outputs[request_id])
                if produced > seen:
                    chunks.append((time.perf_counter(), produced - seen))
                    seen = produced
            timings.append(RequestTiming.from_chunks(started, chunks))
        summary = summarize(timings, sum(t.latency_s for t in timings), 1, requests)
        ttft, itl = summary["ttft_ms"], summary["itl_ms"]
        prompt, output = len(requests[0].prompt_ids), requests[0].output_tokens
        self.report.add(Row(f"{name}: low load, {len(requests)} single {prompt}+{output}-token requests, TTFT p50",
                            f"{ttft['p50']:.2f} ms", f"p90 {ttft['p90']:.2f}, p99 {ttft['p99']:.2f}; "
                            f"ITL p50 {itl['p50']:.2f} ms", ""))
        self.report.details[name] = summary
        return summary

    def hf_baseline(self, name: str, ours: dict, requests: list[BenchRequest]) -> None:
        """transformers' batched generate on `requests`; frees our KV pool first (it needs the memory)."""
        from ops.bench.hf_baseline import hf_generate, hf_model_sharing_weights

        self.release_runner()
        hf = hf_model_sharing_weights(self.runner.model, self.raw)
        result = hf_generate(hf, [r.prompt_ids for r in requests], [r.output_tokens for r in requests],
                             self.args.sampling)
        theirs = result["useful_tokens"] / result["seconds"]
        self.report.add(Row(
            f"{name}: transformers generate, {len(requests)} requests, batches of {result['batch_size']}",
            f"{theirs:,.0f} out tok/s", f"{result['seconds']:.1f} s, {result['useful_tokens']} tokens "
            f"({result['generated_tokens']} generated)", f"ours {ours['output_tok_s'] / theirs:.1f}x",
        ))
        self.report.details[f"{name}-hf"] = result

    def diagnose_hf(self, name: str, count: int) -> None:
        from ops.bench.hf_baseline import hf_diagnose, hf_model_sharing_weights

        hf = hf_model_sharing_weights(self.runner.model, self.raw)
        lens = self.rng.integers(100, 1025, size=count)
        for line in hf_diagnose(hf, [self.prompt(int(n)) for n in lens]):
            print(line, flush=True)

    def release_runner(self) -> None:
        """Frees the KV pool and graphs (transformers needs the memory); the weights stay."""
        self.runner.kv = self.runner.graphs = self.runner.prompt_graphs = None
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
