"""How far our logprobs are from transformers' on the same weights: a random-weight model of a real
shape generates greedily with sampled, top-k and prompt logprobs, then transformers computes the
log-softmax of the same sequences, in the model's dtype and in float32. Prints the max and mean
absolute differences per kind; `--json` writes them for docs/performance.md.

    python -m ops.bench.logprob_accuracy --model qwen3-0.6b [--dtype bfloat16] --json docs/results/logprobs-qwen3-0.6b.json
"""

import argparse

import numpy as np
import torch

from gpu.config import ModelConfig
from gpu.runner import ModelRunner
from gpu.step_io import SequenceInput
from ops.bench.hf_baseline import hf_model_sharing_weights
from ops.bench.records import LogprobError, Row
from ops.bench.report import Report, run_identity
from ops.bench.shapes import SHAPES

TOP = 5


def generate_with_logprobs(runner: ModelRunner, prompts: list[list[int]], new_tokens: int):
    """Greedy generation of every prompt at once; per prompt its sequence (prompt and outputs), the
    prompt logprobs (positions 1..), the outputs' logprobs and their top ids and logprobs."""
    per_seq = -(-(max(map(len, prompts)) + new_tokens) // runner.block_size)
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(len(prompts))]
    asks = dict(sample=True, logprobs=True, top_logprobs=TOP)
    inputs = [
        SequenceInput(p, 0, t, scored_from=0, scored_targets=tuple(p[1:]), **asks) for p, t in zip(prompts, tables)
    ]
    sequences = [list(p) for p in prompts]
    prompt_logprobs = [None] * len(prompts)
    sampled = [[] for _ in prompts]
    for step in range(new_tokens):
        pending = runner.launch(inputs)
        tokens, logprobs = pending.tokens(), pending.logprobs()
        for i, (token, found) in enumerate(zip(tokens, logprobs)):
            if found.prompt is not None:
                prompt_logprobs[i] = found.prompt.logprobs
            sampled[i].append((found.drawn.logprobs[0], found.drawn.top_ids[0], found.drawn.top_logprobs[0]))
            sequences[i].append(token)
        inputs = [
            SequenceInput([seq[-1]], len(seq) - 1, t, output_index=step + 1, **asks)
            for seq, t in zip(sequences, tables)
        ]
    return sequences, prompt_logprobs, sampled


def reference_logprobs(hf, sequence: list[int], device: torch.device) -> torch.Tensor:
    """transformers' log-softmax at every position of `sequence`, float32 [len, vocab]."""
    with torch.inference_mode():
        logits = hf(torch.tensor([sequence], device=device)).logits[0]
    return torch.log_softmax(logits.float(), dim=-1).cpu()


def errors(reference: str, hf, device, prompts, sequences, prompt_logprobs, sampled) -> list[LogprobError]:
    found = {"sampled": [], "prompt": [], "top": []}
    for prompt, sequence, ours_prompt, ours_sampled in zip(prompts, sequences, prompt_logprobs, sampled):
        theirs = reference_logprobs(hf, sequence[:-1], device)  # [len - 1, vocab]: position p predicts p + 1
        targets = torch.tensor(sequence[1:])
        at_targets = theirs.gather(1, targets[:, None])[:, 0].numpy()
        found["prompt"] += list(np.abs(np.asarray(ours_prompt) - at_targets[: len(prompt) - 1]))
        for k, (logprob, top_ids, top_logprobs) in enumerate(ours_sampled):
            row = theirs[len(prompt) - 1 + k]
            found["sampled"].append(abs(logprob - float(at_targets[len(prompt) - 1 + k])))
            found["top"] += list(np.abs(np.asarray(top_logprobs) - row[top_ids].numpy()))
    return [
        LogprobError(reference, kind, len(diffs), float(np.max(diffs)), float(np.mean(diffs)))
        for kind, diffs in found.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.logprob_accuracy", description=__doc__)
    parser.add_argument("--model", default="qwen3-0.6b", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    report = Report()
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report.details.run = run_identity(args.model, device_name, "ops.bench.logprob_accuracy")
    config = ModelConfig.from_dict(SHAPES[args.model])
    runner = ModelRunner.with_random_weights(config, args.device, args.dtype, seed=args.seed, num_kv_blocks=1024)
    rng = np.random.default_rng(args.seed)
    prompts = [rng.integers(0, config.vocab_size, args.prompt_tokens).tolist() for _ in range(args.prompts)]
    report.note(
        f"device: {device_name}; torch {torch.__version__}; model {args.model} shape, random {args.dtype} weights, "
        f"backend {runner.attention_backend_name}; {args.prompts} prompts of {args.prompt_tokens} tokens, "
        f"{args.new_tokens} greedy tokens each, top-{TOP}"
    )
    generated = generate_with_logprobs(runner, prompts, args.new_tokens)
    hf = hf_model_sharing_weights(runner.model, SHAPES[args.model])
    runner.memory.release({"kv_cache"})
    found = errors(f"transformers {args.dtype}", hf, device, prompts, *generated)
    if runner.dtype != torch.float32:
        hf = hf.float()  # last: it upcasts the tensors the runner shares
        found += errors("transformers float32", hf, device, prompts, *generated)
    for error in found:
        report.add(
            Row(
                f"logprobs vs {error.reference}: {error.kind} ({error.count})",
                f"max {error.max_abs:.2e}",
                f"mean {error.mean_abs:.2e}",
                "",
            )
        )
    report.details.logprob_error = found
    report.print_table()
    if args.json:
        report.write_json(args.json)


if __name__ == "__main__":
    main()
