"""The benchmark's whole-system mode: the in-process bench's random weights written as a checkpoint,
served by a real deployment (`kernel.supervisor`: the bus and every actor a process) and driven over
HTTP with the requests the in-process workloads ran, so each HTTP figure has its in-process twin.
"""

import os
import time
from pathlib import Path

import numpy as np
import torch

from ops.bench.checkpoint import write_checkpoint
from ops.bench.http_clients import admin, run_clients
from ops.bench.inprocess import MAX_NUM_SEQS, MAX_PREFILL_TOKENS, InProcessBench
from ops.bench.process_cpu import CpuMeter
from ops.bench.report import Report, Row, p50_p90_p99
from ops.bench.requests import BenchRequest, random_requests
from ops.local_server import RunningServer, start_server

MIN_SWEEP_REQUESTS = 8


class SystemBench:
    def __init__(self, bench: InProcessBench, report: Report, work_dir: Path, checkpoint_dir: Path | None) -> None:
        self.bench = bench
        self.report = report
        self.work_dir = work_dir
        self.checkpoint_dir = checkpoint_dir or work_dir / "model"
        self.server: RunningServer | None = None

    def start(self) -> None:
        """Writes the checkpoint, frees the in-process runner's device memory (the executor needs it)
        and starts the deployment with the in-process engine's settings."""
        bench, args = self.bench, self.bench.args
        identity = {"model": args.model, "seed": args.seed}
        written_s = write_checkpoint(bench.runner.model, bench.raw, self.checkpoint_dir, identity)
        flags = [
            "--device", args.device, "--dtype", "bfloat16",
            "--block-size", str(bench.runner.block_size), "--num-kv-blocks", str(bench.runner.num_kv_blocks),
            "--max-num-seqs", str(MAX_NUM_SEQS), "--max-prefill-tokens", str(MAX_PREFILL_TOKENS),
            "--attention-backend", args.attention_backend,
        ]
        bench.free()
        free = ""
        if bench.device.type == "cuda":
            free_bytes, total_bytes = torch.cuda.mem_get_info(bench.device)
            free = f"; {free_bytes / 2**30:.1f} of {total_bytes / 2**30:.1f} GiB of device memory free for it"
        started = time.perf_counter()
        self.server = start_server(self.work_dir / "server", *flags, model=str(self.checkpoint_dir))
        startup_s = time.perf_counter() - started
        self.report.note(f"whole system: python -m kernel.supervisor {' '.join(flags)} (checkpoint written in "
                         f"{written_s:.1f} s{free}; serving after {startup_s:.1f} s)")
        self.report.details["system"] = {
            "model": args.model, "device": bench.device_name, "flags": flags,
            "checkpoint_s": written_s, "startup_s": startup_s,
        }

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    async def measure(
        self, warm: list[BenchRequest], low_load: list[BenchRequest], low_load_ref: dict,
        offline: list[BenchRequest], offline_ref: dict, levels: list[int], sweep_requests: int | None,
    ) -> None:
        base_url = self.server.base_url
        sampling = self.bench.args.sampling
        await run_clients(base_url, warm, len(warm), sampling)  # the in-process engine ran the same first
        await self.low_load(low_load, low_load_ref, "e", "e-http", detokenize=True)
        await self.low_load(low_load, low_load_ref, "e, ids only", "e-ids-http", detokenize=False)
        cpu = CpuMeter({"bench clients": os.getpid(), **self.server.process_pids()})
        cpu.start()
        run = await run_clients(base_url, offline, len(offline), sampling)
        self.offline(run, offline_ref, cpu.shares())
        sweep = self.report.details["sweep"] = []
        lengths = np.random.default_rng(self.bench.args.seed + 2)
        for level in levels:
            count = sweep_requests or max(MIN_SWEEP_REQUESTS, 2 * level)
            requests = random_requests(self.bench.rng, lengths, self.bench.config.vocab_size, count,
                                       self.bench.args.lengths, self.bench.args.lengths)
            run = await run_clients(base_url, requests, level, sampling)
            sweep.append(run)
            ttft, itl = run["ttft_ms"], run["itl_ms"]
            latency = f"TTFT p50 {ttft['p50']:.1f}, p99 {ttft['p99']:.1f} ms; ITL p50 {itl['p50']:.2f} ms"
            self.report.add(Row(f"sweep over HTTP: concurrency {level}, {count} requests",
                                f"{run['output_tok_s']:,.0f} out tok/s", latency, ""))

    async def low_load(
        self, requests: list[BenchRequest], reference: dict, name: str, key: str, detokenize: bool
    ) -> None:
        """Runs e's requests one at a time, from an empty prefix cache as in-process: "e" with text, as
        chat clients ask; "e, ids only" without (`detokenize` false), as the in-process engine gives its
        tokens. `key`: the run's entry in the JSON details."""
        base_url = self.server.base_url
        await admin(base_url, "POST", "/admin/flush_cache")
        hits_before = (await admin(base_url, "GET", "/admin/stats"))["cache_hit_tokens"]
        run = await run_clients(base_url, requests, 1, self.bench.args.sampling, detokenize)
        run["cache_hit_tokens"] = (await admin(base_url, "GET", "/admin/stats"))["cache_hit_tokens"] - hits_before
        ttft, ref = run["ttft_ms"], reference["ttft_ms"]
        added = ttft["p50"] - ref["p50"]
        self.report.add(Row(f"{name} over HTTP: TTFT p50", f"{ttft['p50']:.2f} ms", f"in-process {ref['p50']:.2f} ms",
                            f"{added:+.2f} ms", "<= +3 ms"))
        self.report.add(Row(f"{name} over HTTP:   TTFT p90 / p99; ITL p50",
                            f"{ttft['p90']:.2f} / {ttft['p99']:.2f} ms; {run['itl_ms']['p50']:.2f} ms", f"in-process {ref['p90']:.2f} / {ref['p99']:.2f} ms; "
                            f"{reference['itl_ms']['p50']:.2f} ms", ""))
        self.report.details[key] = {**run, "added_ttft_p50_ms": added}

    def offline(self, run: dict, reference: dict, cpu_shares: dict[str, float]) -> None:
        """d's figures beside in-process; `cpu_shares`: how busy each process was. The run measures
        the server only while none of the clients, nats-server and the actors is near one core, but
        the executor: its loop polls the step on the GPU, so it always shows about one."""
        ratio = run["output_tok_s"] / reference["output_tok_s"]
        self.report.add(Row(f"d over HTTP: {run['requests']} requests, all at once",
                            f"{run['output_tok_s']:,.0f} out tok/s",
                            f"in-process {reference['output_tok_s']:,.0f} out tok/s", f"{ratio:.3f}", ">= 0.95"))
        self.report.add(Row("d over HTTP:   TTFT p50 / p90 / p99", p50_p90_p99(run["ttft_ms"]),
                            f"{run['input_tok_s']:,.0f} in tok/s; {run['seconds']:.1f} s, {run['output_tokens']} tokens", ""))
        self.report.add(Row("d over HTTP:   ITL p50 / p90 / p99", p50_p90_p99(run["itl_ms"]), "", ""))
        self.report.add(Row("d over HTTP:   requests taken (response headers) p50 / last",
                            f"{run['taken_ms']['p50']:.1f} / {run['last_taken_ms']:.1f} ms", "", ""))
        busiest = sorted(cpu_shares.items(), key=lambda item: -item[1])
        self.report.add(Row("d over HTTP:   CPU busy, cores", ", ".join(f"{name} {share:.2f}" for name, share in busiest),
                            "", ""))
        self.report.details["d-http"] = {**run, "ratio_to_in_process": ratio, "cpu_cores": cpu_shares}
