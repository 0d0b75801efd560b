"""The benchmark's whole-system mode: the test bed's random weights written as a checkpoint,
served by a real deployment (`kernel.supervisor`: the bus and every actor a process) and driven over
HTTP with the requests the in-process workloads ran, so each HTTP figure has its in-process twin.
"""

import os
import time
from pathlib import Path

import msgspec
import numpy as np
import torch

from ops.bench.checkpoint import write_checkpoint
from ops.bench.http_clients import admin, run_clients
from ops.bench.process_cpu import CpuMeter
from ops.bench.records import LowLoadHttpFigures, OfflineHttpFigures, Row, RunFigures, SystemSetup
from ops.bench.report import Report, p50_p90_p99
from ops.bench.requests import BenchRequest, random_requests
from ops.bench.testbed import MAX_NUM_SEQS, MAX_PREFILL_TOKENS, Testbed
from ops.local_server import RunningServer, start_server

MIN_SWEEP_REQUESTS = 8


class SystemBench:
    def __init__(self, testbed: Testbed, report: Report, work_dir: Path, checkpoint_dir: Path | None) -> None:
        self.testbed = testbed
        self.report = report
        self.work_dir = work_dir
        self.checkpoint_dir = checkpoint_dir or work_dir / "model"
        self.server: RunningServer | None = None

    def start(self) -> None:
        """Writes the checkpoint, frees the in-process runner's device memory (the executor needs it)
        and starts the deployment with the in-process engine's settings."""
        bed, args = self.testbed, self.testbed.args
        identity = {"model": args.model, "seed": args.seed}
        written_s = write_checkpoint(bed.runner.model, bed.raw, self.checkpoint_dir, identity)
        flags = [
            "--device",
            args.device,
            "--dtype",
            "bfloat16",
            "--block-size",
            str(bed.runner.block_size),
            "--num-kv-blocks",
            str(bed.runner.num_kv_blocks),
            "--max-num-seqs",
            str(MAX_NUM_SEQS),
            "--max-prefill-tokens",
            str(MAX_PREFILL_TOKENS),
            "--attention-backend",
            args.attention_backend,
            "--incremental-streaming-output",  # as SGLang's benchmarks: no event repeats the tokens before it
        ]
        bed.free()
        free = ""
        if bed.device.type == "cuda":
            free_bytes, total_bytes = torch.cuda.mem_get_info(bed.device)
            free = f"; {free_bytes / 2**30:.1f} of {total_bytes / 2**30:.1f} GiB of device memory free for it"
        started = time.perf_counter()
        self.server = start_server(self.work_dir / "server", *flags, model=str(self.checkpoint_dir))
        startup_s = time.perf_counter() - started
        self.report.note(
            f"whole system: python -m kernel.supervisor {' '.join(flags)} (checkpoint written in "
            f"{written_s:.1f} s{free}; serving after {startup_s:.1f} s)"
        )
        self.report.details.system = SystemSetup(args.model, bed.device_name, flags, written_s, startup_s)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    async def measure(
        self,
        warm: list[BenchRequest],
        low_load: list[BenchRequest],
        low_load_ref: RunFigures,
        offline: list[BenchRequest],
        offline_ref: RunFigures,
        levels: list[int],
        sweep_requests: int | None,
    ) -> None:
        bed, details = self.testbed, self.report.details
        base_url = self.server.base_url
        sampling = bed.args.sampling
        await run_clients(base_url, warm, len(warm), sampling)  # the in-process engine ran the same first
        details.e_http = await self.low_load(low_load, low_load_ref, "e", detokenize=True)
        details.e_ids_http = await self.low_load(low_load, low_load_ref, "e, ids only", detokenize=False)
        cpu = CpuMeter({"bench clients": os.getpid(), **self.server.process_pids()})
        cpu.start()
        run = await run_clients(base_url, offline, len(offline), sampling)
        details.d_http = self.offline(run, offline_ref, cpu.shares())
        sweep = details.sweep = []
        lengths = np.random.default_rng(bed.args.seed + 2)
        for level in levels:
            count = sweep_requests or max(MIN_SWEEP_REQUESTS, 2 * level)
            requests = random_requests(
                bed.rng, lengths, bed.config.vocab_size, count, bed.args.lengths, bed.args.lengths
            )
            run = await run_clients(base_url, requests, level, sampling)
            sweep.append(run)
            ttft, itl = run.ttft_ms, run.itl_ms
            latency = f"TTFT p50 {ttft.p50:.1f}, p99 {ttft.p99:.1f} ms; ITL p50 {itl.p50:.2f} ms"
            self.report.add(
                Row(
                    f"sweep over HTTP: concurrency {level}, {count} requests",
                    f"{run.output_tok_s:,.0f} out tok/s",
                    latency,
                    "",
                )
            )

    async def low_load(
        self, requests: list[BenchRequest], reference: RunFigures, name: str, detokenize: bool
    ) -> LowLoadHttpFigures:
        """Runs e's requests one at a time, from an empty prefix cache as in-process: "e" with text, as
        chat clients ask; "e, ids only" without (`detokenize` false), as the in-process engine gives its
        tokens."""
        base_url = self.server.base_url
        await admin(base_url, "POST", "/admin/flush_cache")
        hits_before = (await admin(base_url, "GET", "/admin/stats"))["cache_hit_tokens"]
        run = await run_clients(base_url, requests, 1, self.testbed.args.sampling, detokenize)
        hits = (await admin(base_url, "GET", "/admin/stats"))["cache_hit_tokens"] - hits_before
        ttft, ref = run.ttft_ms, reference.ttft_ms
        added = ttft.p50 - ref.p50
        self.report.add(
            Row(
                f"{name} over HTTP: TTFT p50",
                f"{ttft.p50:.2f} ms",
                f"in-process {ref.p50:.2f} ms",
                f"{added:+.2f} ms",
                "<= +3 ms",
            )
        )
        self.report.add(
            Row(
                f"{name} over HTTP:   TTFT p90 / p99; ITL p50",
                f"{ttft.p90:.2f} / {ttft.p99:.2f} ms; {run.itl_ms.p50:.2f} ms",
                f"in-process {ref.p90:.2f} / {ref.p99:.2f} ms; {reference.itl_ms.p50:.2f} ms",
                "",
            )
        )
        return LowLoadHttpFigures(**msgspec.structs.asdict(run), cache_hit_tokens=hits, added_ttft_p50_ms=added)

    def offline(self, run: RunFigures, reference: RunFigures, cpu_shares: dict[str, float]) -> OfflineHttpFigures:
        """d's figures beside in-process; `cpu_shares`: how busy each process was. The run measures
        the server only while none of the clients, nats-server and the actors is near one core, but
        the executor: its loop polls the step on the GPU, so it always shows about one."""
        ratio = run.output_tok_s / reference.output_tok_s
        self.report.add(
            Row(
                f"d over HTTP: {run.requests} requests, all at once",
                f"{run.output_tok_s:,.0f} out tok/s",
                f"in-process {reference.output_tok_s:,.0f} out tok/s",
                f"{ratio:.3f}",
                ">= 0.95",
            )
        )
        self.report.add(
            Row(
                "d over HTTP:   TTFT p50 / p90 / p99",
                p50_p90_p99(run.ttft_ms),
                f"{run.input_tok_s:,.0f} in tok/s; {run.seconds:.1f} s, {run.output_tokens} tokens",
                "",
            )
        )
        self.report.add(Row("d over HTTP:   ITL p50 / p90 / p99", p50_p90_p99(run.itl_ms), "", ""))
        self.report.add(
            Row(
                "d over HTTP:   requests taken (response headers) p50 / last",
                f"{run.taken_ms.p50:.1f} / {run.last_taken_ms:.1f} ms",
                "",
                "",
            )
        )
        busiest = sorted(cpu_shares.items(), key=lambda item: -item[1])
        self.report.add(
            Row("d over HTTP:   CPU busy, cores", ", ".join(f"{name} {share:.2f}" for name, share in busiest), "", "")
        )
        return OfflineHttpFigures(**msgspec.structs.asdict(run), ratio_to_in_process=ratio, cpu_cores=cpu_shares)
