"""Sleep and wake on the GPU (gpu/memory_occupation.py): a runner of a real model shape (random
weights, the KV pool sized as the server sizes it) releases every tag and resumes, `--cycles` times.
Reports against issue 33's targets: the share of the device memory the runner held that another
process sees free while it sleeps (>= 0.95), wake to the next token (resume, the graphs captured
again, a prompt's first token: <= 3 s), the same greedy tokens after every wake, and no growth of
the memory held awake or asleep over the cycles. `--json` writes them (records.SleepWakeFigures).

    python -m ops.bench.sleep_wake --model llama-3.1-8b --json docs/results/sleep-wake-llama-3.1-8b.json
"""

import argparse
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

from gpu.config import ModelConfig
from gpu.runner import ModelRunner
from gpu.step_io import SequenceInput
from kernel.actor import freeze_startup_objects
from ops.bench.records import Row, SleepWakeFigures
from ops.bench.report import Report, run_identity
from ops.bench.shapes import SHAPES

FREED_TARGET = 0.95
WAKE_TARGET_S = 3.0
# The driver hands out memory in pages of 2 MiB, and the allocator's cached blocks move by a few;
# growth beyond this over the cycles is a leak.
GROWTH_TOLERANCE_BYTES = 64 << 20
MiB = 1 << 20

_PROBE = """
import sys, torch
torch.cuda.init()
for _ in sys.stdin:
    print(torch.cuda.mem_get_info({index})[0], flush=True)
"""


class FreeMemoryProbe:
    """A process of its own that says, when asked, how much memory the device has free
    (`torch.cuda.mem_get_info`): what the driver could give another process now, which no count
    kept by this process proves. Its own CUDA context stays the same size between questions."""

    def __init__(self, device: torch.device) -> None:
        index = device.index if device.index is not None else torch.cuda.current_device()
        self._process = subprocess.Popen(
            [sys.executable, "-c", _PROBE.format(index=index)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.free_bytes()  # the first answer waits for its context, and counts it

    def free_bytes(self) -> int:
        self._process.stdin.write("\n")
        self._process.stdin.flush()
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"the free-memory probe exited with {self._process.wait()}")
        return int(line)

    def close(self) -> None:
        self._process.stdin.close()
        self._process.wait(timeout=30)


def greedy(runner: ModelRunner, prompt: list[int], new_tokens: int) -> list[int]:
    """The prompt's greedy continuation, one step per token, in blocks from 0 on."""
    table = list(range(-(-(len(prompt) + new_tokens) // runner.block_size)))
    tokens = runner.step([SequenceInput(prompt, 0, table, sample=True)])
    for position in range(len(prompt), len(prompt) + new_tokens - 1):
        tokens += runner.step([SequenceInput([tokens[-1]], position, table, sample=True)])
    return tokens


def cycles(runner: ModelRunner, probe: FreeMemoryProbe, prompt: list[int], count: int, new_tokens: int) -> dict:
    """`count` sleep/wake cycles; per cycle its times, the memory free asleep and awake (as the
    probe sees it) and whether the greedy tokens stayed the same."""
    memory = runner.memory
    expected = greedy(runner, prompt, new_tokens)
    kinds = ("release", "resume", "capture", "first_token", "free_asleep", "torch_asleep", "free_awake", "same")
    found = {k: [] for k in kinds}
    for _ in range(count):
        started = time.perf_counter()
        memory.release(None)
        found["release"].append(time.perf_counter() - started)
        found["free_asleep"].append(probe.free_bytes())
        found["torch_asleep"].append(memory.device_bytes())
        started = time.perf_counter()
        memory.resume(["weights", "kv_cache"])
        resumed = time.perf_counter()
        memory.resume(["cuda_graph"])  # the graphs come back with the last tag
        captured = time.perf_counter()
        first = greedy(runner, prompt, 1)
        found["first_token"].append(time.perf_counter() - captured)
        found["resume"].append(resumed - started)
        found["capture"].append(captured - resumed)
        found["same"].append(first + greedy(runner, prompt, new_tokens)[1:] == expected)
        found["free_awake"].append(probe.free_bytes())
    return found


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.sleep_wake", description=__doc__)
    parser.add_argument("--model", default="llama-3.1-8b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    report = Report()
    device_name = torch.cuda.get_device_name(device)
    report.details.run = run_identity(args.model, device_name, "ops.bench.sleep_wake")
    probe = FreeMemoryProbe(device)
    free_before = probe.free_bytes()
    config = ModelConfig.from_dict(SHAPES[args.model])
    runner = ModelRunner.with_random_weights(config, args.device, "bfloat16", seed=args.seed)
    freeze_startup_objects()  # as the executor does: a leak through a frozen cycle would show
    prompt = np.random.default_rng(args.seed).integers(0, config.vocab_size, args.prompt_tokens).tolist()
    greedy(runner, prompt, args.new_tokens)  # the first steps' workings, held awake from now on
    held = free_before - probe.free_bytes()
    report.note(
        f"device: {device_name}; torch {torch.__version__}; model {args.model} shape, random bf16 weights, "
        f"backend {runner.attention_backend_name}, {runner.num_kv_blocks} KV blocks; all tags released and "
        f"resumed {args.cycles} times; wake: resume, capture, then a {args.prompt_tokens}-token prompt's first token"
    )
    found = cycles(runner, probe, prompt, args.cycles, args.new_tokens)
    probe.close()
    wakes = [sum(parts) for parts in zip(found["resume"], found["capture"], found["first_token"])]
    figures = SleepWakeFigures(
        cycles=args.cycles,
        held_bytes=held,
        freed_fraction=min(f - (free_before - held) for f in found["free_asleep"]) / held,
        asleep_torch_bytes=max(found["torch_asleep"]),
        host_bytes=runner.memory.host_bytes(),
        first_release_s=found["release"][0],
        release_s=statistics.median(found["release"][1:] or found["release"]),
        resume_s=statistics.median(found["resume"]),
        capture_s=statistics.median(found["capture"]),
        first_token_s=statistics.median(found["first_token"]),
        wake_s=statistics.median(wakes),
        wake_max_s=max(wakes),
        wakes_s=wakes,
        same_tokens=all(found["same"]),
        awake_growth_bytes=found["free_awake"][0] - min(found["free_awake"]),
        asleep_growth_bytes=found["free_asleep"][0] - min(found["free_asleep"]),
    )
    add_rows(report, figures)
    report.details.sleep_wake = figures
    report.print_table()
    if args.json:
        report.write_json(args.json)


def add_rows(report: Report, f: SleepWakeFigures) -> None:
    report.add(
        Row(
            "sleep: device memory freed, seen by another process",
            f"{f.freed_fraction * f.held_bytes / 2**30:.2f} GiB",
            f"of {f.held_bytes / 2**30:.2f} GiB held; torch keeps {f.asleep_torch_bytes / 2**30:.2f} GiB asleep",
            f"{f.freed_fraction:.4f}",
            f">= {FREED_TARGET}",
        )
    )
    report.add(
        Row(
            "sleep: release (weights to pinned host, all freed)",
            f"{f.release_s:.3f} s",
            f"first {f.first_release_s:.3f} s",
            "",
            "",
        )
    )
    report.add(
        Row(
            "wake to the next token (median / max)",
            f"{f.wake_s:.3f} / {f.wake_max_s:.3f} s",
            f"resume {f.resume_s:.3f} + capture {f.capture_s:.3f} + first token {f.first_token_s:.3f} s",
            "",
            f"<= {WAKE_TARGET_S} s",
        )
    )
    report.add(Row("greedy tokens after every wake", "same" if f.same_tokens else "DIFFERENT", "", "", "same"))
    report.add(
        Row(
            f"growth over {f.cycles} cycles (awake / asleep)",
            f"{f.awake_growth_bytes / MiB:.0f} / {f.asleep_growth_bytes / MiB:.0f} MiB",
            "",
            "",
            f"<= {GROWTH_TOLERANCE_BYTES // MiB} MiB",
        )
    )


if __name__ == "__main__":
    main()
