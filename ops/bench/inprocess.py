"""The benchmark's in-process workloads: the in-process engine (actors/inprocess.py: the scheduler's
batcher and the executor's batch, no bus) stepped on the test bed (testbed.py), each figure judged
against the ceilings measured in the same run. `ops.bench` runs them; `ops.bench.system` compares
the whole system with them. Each workload returns its record (records.py) for the report's JSON.
"""

import statistics
import time
from dataclasses import dataclass

import msgspec
import numpy as np
import torch

from actors.executor.grammars import Grammars
from actors.inprocess import InProcessEngine
from ops.bench.records import DecodeFigures, HfFigures, OfflineFigures, PrefillFigures, Row, RunFigures
from ops.bench.report import p50_p90_p99
from ops.bench.requests import BenchRequest, RequestTiming, Sampling, summarize
from ops.bench.testbed import MAX_NUM_SEQS, MAX_PREFILL_TOKENS, Testbed


@dataclass(frozen=True)
class StepTiming:
    wall_s: float
    launch_s: float  # the host time of the launch the step made
    decodes: int  # of the step it booked
    prefill_tokens: int
    kv_tokens: int  # read by the booked step's decodes


class InProcessBench:
    """`sampling`: how every request draws (default: the command line's); `grammars`: what its
    constraints compile with, if it has any (structured output)."""

    def __init__(self, testbed: Testbed, sampling: Sampling | None = None, grammars: Grammars | None = None) -> None:
        self.testbed = testbed
        self.grammars = grammars
        self.args = testbed.args
        self.sampling = sampling or self.args.sampling
        self.report = testbed.report
        self.profiler = None  # a cProfile.Profile while a workload is profiled (--profile)

    def engine(self) -> InProcessEngine:
        return InProcessEngine(
            self.testbed.runner,
            max_num_seqs=MAX_NUM_SEQS,
            max_prefill_tokens=MAX_PREFILL_TOKENS,
            grammars=self.grammars,
        )

    def warm_up(self, requests: list[BenchRequest]) -> None:
        """Runs `requests` unmeasured, so first-use costs (kernel compilation, allocator growth)
        fall on no measured workload; the HTTP side gets the same requests first."""
        engine = self.engine()
        for i, request in enumerate(requests):
            engine.submit(f"warm-{i}", request.prompt_ids, self.sampling.params(request.output_tokens))
        engine.run()

    def run_steps(self, engine: InProcessEngine, prompt_lens: dict[str, int]) -> list[StepTiming]:
        """Steps until idle, timing each step. The engine overlaps steps: it launches step N+1 before
        it reads step N's tokens, so what the runner adds is the host time of a launch, spent while
        the GPU runs the step before."""
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
            steps.append(
                StepTiming(
                    wall,
                    engine.launch_s,
                    len(decodes),
                    sum(u.prefilled_tokens for u in output.updates),
                    sum(prompt_lens[u.request_id] + u.output_index for u in decodes),
                )
            )
        return steps

    def decode(self, name: str, batch: int, context: int, new_tokens: int, target: str) -> DecodeFigures:
        bed = self.testbed
        graphs = bed.runner.graphs
        if graphs is not None:
            graphs.start_timing()
        engine = self.engine()
        if self.args.profile:
            import cProfile

            self.profiler = cProfile.Profile()
        lens = {}
        for i in range(batch):
            engine.submit(f"{name}-{i}", bed.prompt(context), self.sampling.params(new_tokens))
            lens[f"{name}-{i}"] = context
        steps = [s for s in self.run_steps(engine, lens) if s.decodes == batch and s.prefill_tokens == 0]
        steps = steps[2:]  # the first decode steps after a prefill warm the allocator
        if self.profiler is not None:
            import pstats

            print(
                f"-- {name}: where the engine's steps spend host time (all steps, prefill included; the wait "
                "for a step's tokens is its one synchronize line)",
                flush=True,
            )
            pstats.Stats(self.profiler).sort_stats("tottime").print_stats(18)
            self.profiler = None
        wall = statistics.median(s.wall_s for s in steps)
        runner = statistics.median(s.launch_s for s in steps)
        kv_tokens = statistics.median(s.kv_tokens for s in steps)
        bound = (bed.decode_weight_bytes + kv_tokens * bed.kv_bytes_per_token) / bed.bandwidth
        label = f"{name}: batch-{batch} decode, {context} ctx, step"
        self.report.add(Row(label, f"{wall * 1e3:.2f} ms", f"{bound * 1e3:.2f} ms", f"{wall / bound:.2f}x", target))
        self.report.add(
            Row(
                f"{name}:   of which ModelRunner.launch (host, overlapped)",
                f"{runner * 1e3:.2f} ms",
                f"{bound * 1e3:.2f} ms",
                f"{runner / bound:.2f}x",
            )
        )
        size = graphs.padded_size(batch) if graphs else None
        replays = graphs.stop_timing(size)[2:] if graphs else []
        gpu = None
        if replays:
            gpu = statistics.median(replays)
            self.report.add(
                Row(
                    f"{name}:   of which GPU (graph replay, events)",
                    f"{gpu * 1e3:.2f} ms",
                    f"{bound * 1e3:.2f} ms",
                    f"{gpu / bound:.2f}x",
                )
            )
        return DecodeFigures(len(steps), wall, runner, gpu, bound, kv_tokens, bed.decode_weight_bytes)

    def prefill(self, name: str, prompt_len: int, count: int) -> PrefillFigures:
        bed = self.testbed
        params = self.sampling.params(1)
        warm = self.engine()
        for i in range(2):
            warm.submit(f"warm-{i}", bed.prompt(prompt_len), params)
        warm.run()
        engine = self.engine()
        for i in range(count):
            engine.submit(f"{name}-{i}", bed.prompt(prompt_len), params)
        if bed.device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        engine.run()
        seconds = time.perf_counter() - started
        cfg = bed.config
        per_layer = (
            cfg.hidden_size * (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
            + cfg.num_attention_heads * cfg.head_dim * cfg.hidden_size
            + 3 * cfg.hidden_size * cfg.intermediate_size
        )
        linear = 2 * per_layer * cfg.num_hidden_layers * prompt_len * count
        attention = 2 * cfg.num_attention_heads * cfg.head_dim * prompt_len**2 * cfg.num_hidden_layers * count  # causal
        head = 2 * cfg.hidden_size * cfg.vocab_size * count
        achieved = (linear + attention + head) / seconds
        self.report.add(
            Row(
                f"{name}: prefill {count} x {prompt_len}-token prompts",
                f"{achieved / 1e12:.1f} TFLOP/s",
                f"{bed.gemm / 1e12:.1f} TFLOP/s",
                f"{achieved / bed.gemm:.2f}",
                ">= 0.60",
            )
        )
        self.report.add(
            Row(
                f"{name}:   time, tokens/s", f"{seconds * 1e3:.0f} ms", f"{prompt_len * count / seconds:,.0f} tok/s", ""
            )
        )
        return PrefillFigures(seconds, linear + attention + head)

    def offline_requests(self, count: int, lengths: tuple[int, int]) -> list[BenchRequest]:
        """Workload d's requests. Lengths from their own generator: the same requests whatever ran
        before and whatever the model (the prompts' tokens come from the shared one)."""
        drawn = np.random.default_rng(self.args.seed + 1).integers(lengths[0], lengths[1] + 1, size=(count, 2))
        return [BenchRequest(self.testbed.prompt(int(p)), int(o)) for p, o in drawn]

    def throughput(self, name: str, requests: list[BenchRequest]) -> OfflineFigures:
        """All of `requests` submitted at once and run to the end, each token timed when its step is
        booked, as a client would see it arrive."""
        engine = self.engine()
        request_ids = [f"{name}-{i}" for i in range(len(requests))]
        for request_id, request in zip(request_ids, requests):
            engine.submit(request_id, request.prompt_ids, self.sampling.params(request.output_tokens))
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
        figures = OfflineFigures(
            **msgspec.structs.asdict(summarize(timings, seconds, len(requests), requests)), steps=engine.steps
        )
        self.report.add(
            Row(
                f"{name}: offline, {len(requests)} requests, ours",
                f"{figures.output_tok_s:,.0f} out tok/s",
                f"{figures.input_tok_s:,.0f} in tok/s; {seconds:.1f} s, {figures.output_tokens} tokens",
                "",
            )
        )
        self.report.add(Row(f"{name}:   TTFT p50 / p90 / p99", p50_p90_p99(figures.ttft_ms), "", ""))
        self.report.add(Row(f"{name}:   ITL p50 / p90 / p99", p50_p90_p99(figures.itl_ms), "", ""))
        return figures

    def low_load(self, name: str, requests: list[BenchRequest]) -> RunFigures:
        """One request at a time, each run to its end; TTFT is from the submit to the end of the
        step that drew the first token (that step's device work included: it ends in a sync)."""
        engine = self.engine()
        timings = []
        for i, request in enumerate(requests):
            request_id = f"{name}-{i}"
            started = time.perf_counter()
            engine.submit(request_id, request.prompt_ids, self.sampling.params(request.output_tokens))
            chunks, seen = [], 0
            while engine.busy:
                engine.step()
                produced = len(engine.outputs[request_id])
                if produced > seen:
                    chunks.append((time.perf_counter(), produced - seen))
                    seen = produced
            timings.append(RequestTiming.from_chunks(started, chunks))
        summary = summarize(timings, sum(t.latency_s for t in timings), 1, requests)
        ttft, itl = summary.ttft_ms, summary.itl_ms
        prompt, output = len(requests[0].prompt_ids), requests[0].output_tokens
        self.report.add(
            Row(
                f"{name}: low load, {len(requests)} single {prompt}+{output}-token requests, TTFT p50",
                f"{ttft.p50:.2f} ms",
                f"p90 {ttft.p90:.2f}, p99 {ttft.p99:.2f}; ITL p50 {itl.p50:.2f} ms",
                "",
            )
        )
        return summary

    def hf_baseline(self, name: str, ours: RunFigures, requests: list[BenchRequest]) -> HfFigures:
        """transformers' batched generate on `requests`; frees our KV pool first (it needs the memory)."""
        from ops.bench.hf_baseline import hf_generate, hf_model_sharing_weights

        self.testbed.release_runner()
        hf = hf_model_sharing_weights(self.testbed.runner.model, self.testbed.raw)
        result = hf_generate(hf, [r.prompt_ids for r in requests], [r.output_tokens for r in requests], self.sampling)
        theirs = result.useful_tokens / result.seconds
        self.report.add(
            Row(
                f"{name}: transformers generate, {len(requests)} requests, batches of {result.batch_size}",
                f"{theirs:,.0f} out tok/s",
                f"{result.seconds:.1f} s, {result.useful_tokens} tokens ({result.generated_tokens} generated)",
                f"ours {ours.output_tok_s / theirs:.1f}x",
            )
        )
        return result

    def diagnose_hf(self, count: int) -> None:
        """Prints where transformers' decode step goes at batch `count` (--hf-diagnose)."""
        from ops.bench.hf_baseline import hf_diagnose, hf_model_sharing_weights

        hf = hf_model_sharing_weights(self.testbed.runner.model, self.testbed.raw)
        lens = self.testbed.rng.integers(100, 1025, size=count)
        for line in hf_diagnose(hf, [self.testbed.prompt(int(n)) for n in lens]):
            print(line, flush=True)
