"""The host side of `--feature-cost json_schema` without a GPU: workload d's 256 requests (its
lengths, all submitted at once) under feature_cost.py's JSON schema, compiled for the benchmark's
tokenizer (checkpoint.py: 128,256 tokens, most of them filler words), stepped through the in-process
engine on a runner that draws a random allowed token from each row's mask, as random weights do.
Each launch's mask work is timed as the runner does it: the host bitmask with every bit set
(gpu/token_mask.py), then `StepMasks` (the previous step's tokens fed to the matchers, the masks
filled and checked).

    python -m ops.bench.grammar_host [--fill-threads N] [--requests 256]

On the GPU this work runs while the forward pass does (about 13 ms a step for llama-3.1-8b at 256
sequences): a step whose mask work takes longer delays the draw.
"""

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from actors.executor.grammars import Grammars
from actors.inprocess import InProcessEngine
from gpu.step_io import PendingStep, SequenceInput
from gpu.token_mask import TokenMasks
from kernel.actor import freeze_startup_objects
from ops.bench.checkpoint import write_tokenizer
from ops.bench.feature_cost import BENCH_SCHEMA
from ops.bench.requests import Sampling
from ops.bench.shapes import SHAPES
from ops.bench.testbed import MAX_NUM_SEQS, MAX_PREFILL_TOKENS
from schemas.generate import Constraint

MODEL = "llama-3.1-8b"  # the vocabulary and end tokens of the GPU run's model
LENGTHS = (100, 1024)  # ops.bench's --lengths default: d's prompt and output lengths


class MaskDrawingRunner:
    """What the in-process engine needs of a ModelRunner: a launch calls the masks as the real one
    does, then draws for each row a random token its mask allows (no forward pass)."""

    block_size = 16
    num_kv_blocks = 1 << 20
    max_model_len = 4096

    def __init__(self, vocab_size: int, eos_token_ids: list[int], seed: int) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.rng = np.random.default_rng(seed)
        self.token_masks = TokenMasks(vocab_size, torch.device("cpu"))
        # Of each launch with masks: its drawing rows, and the seconds of its mask work, in wall time
        # and in this thread's CPU time (all of it with one fill thread; robust to a busy machine).
        self.mask_s: list[tuple[int, float, float]] = []

    def draw(self, words: np.ndarray) -> np.ndarray:
        """A token drawn uniformly among those each row of the bitmask [R, words] allows (0 where none)."""
        counts = np.cumsum(np.bitwise_count(words), axis=1, dtype=np.int64)  # [R, words]: allowed ids so far
        nth = (self.rng.random(len(words)) * counts[:, -1]).astype(np.int64)  # [R]: which allowed id
        word = (counts <= nth[:, None]).sum(axis=1).clip(max=words.shape[1] - 1)  # [R]: the word holding it
        drawn = np.zeros(len(words), np.int64)
        for row, (w, n) in enumerate(zip(word.tolist(), nth.tolist())):
            if counts[row, -1]:
                skip = n - (counts[row, w - 1] if w else 0)  # allowed ids of the word to pass first
                bits = [b for b in range(32) if int(words[row, w]) >> b & 1]
                drawn[row] = 32 * w + bits[skip]
        return drawn

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        pass  # no KV cache

    def launch(self, seqs: list[SequenceInput], masks=None) -> PendingStep:
        rows = np.flatnonzero([s.sample for s in seqs])
        drawn = self.rng.integers(0, self.vocab_size, len(rows))
        if masks is not None:
            started, cpu = time.perf_counter(), time.thread_time()
            host = self.token_masks.host_rows(len(rows))  # every bit set, as the runner hands it over
            masks(host)
            self.mask_s.append((len(rows), time.perf_counter() - started, time.thread_time() - cpu))
            drawn = self.draw(host.numpy().view(np.uint32))
        return PendingStep(len(seqs), rows, torch.from_numpy(drawn), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--fill-threads", type=int, default=None, help="default: the executor's choice")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    shape = SHAPES[MODEL]
    vocab_size, eos = shape["vocab_size"], list(shape["eos_token_id"])
    constraint = Constraint("json_schema", json.dumps(BENCH_SCHEMA))
    with tempfile.TemporaryDirectory(prefix="bench-grammar-") as work:
        write_tokenizer(Path(work), vocab_size)
        grammars = Grammars(work, vocab_size, eos, fill_threads=args.fill_threads)
        grammars.compile(constraint).result()  # compiled before anything is timed, as the bench's warm-up does
        freeze_startup_objects()  # as the test bed does once its runner is built
        runner = MaskDrawingRunner(vocab_size, eos, args.seed)
        engine = InProcessEngine(runner, MAX_NUM_SEQS, MAX_PREFILL_TOKENS, grammars=grammars)
        lengths = np.random.default_rng(args.seed + 1).integers(LENGTHS[0], LENGTHS[1] + 1, size=(args.requests, 2))
        prompts = np.random.default_rng(args.seed)
        sampling = Sampling(more={"constraint": constraint})
        for i, (prompt, output) in enumerate(lengths):
            engine.submit(f"d-{i}", prompts.integers(0, vocab_size, prompt).tolist(), sampling.params(int(output)))
        engine.run()
    rows, wall, cpu = np.array(runner.mask_s).T
    ended = dict(Counter(engine.finish_reasons.values()))  # all "length": the grammar took every draw
    print(f"{len(rows)} launches with masks, {grammars.fill_threads} fill threads, {int(rows.sum())} masked draws")
    print(f"requests ended: {ended}")
    for label, chosen in (("all", rows > 0), ("200+ rows", rows >= 200)):
        for kind, seconds in (("wall", wall), ("main thread CPU", cpu)) if chosen.any() else ():
            p50, p90, top = *np.percentile(seconds[chosen] * 1e3, [50, 90]), seconds[chosen].max() * 1e3
            print(
                f"  {label} ({chosen.sum()}): mask work, {kind}: p50 {p50:.2f} ms, p90 {p90:.2f} ms, max {top:.2f} ms"
            )


if __name__ == "__main__":
    main()
