"""What a feature of the hot path costs (`--feature-cost`): workloads a (the batch-1 decode step)
and d (offline throughput) rerun in the same run with every request using the feature, each beside
the run without it. Targets from issue 32: logprobs (sampled + top-5) keep d >= 0.97 and a within
+2%; penalties, a bias and a mask on every row keep d >= 0.95. From issue 35: a JSON schema on
every request (structured output) keeps d >= 0.90. From issue 36: the batch-invariant kernels of
`--deterministic` (`measure_deterministic_cost`, a runner of their own on the same weights) keep a
within 1.15x and d within 1/1.15.

The JSON schema's grammar is compiled for a real vocabulary, the default model's tokenizer (a BPE of
49,152 tokens, read from its GGUF file) where its package is installed: the masks of a real BPE cost
many times those of a small one. Its ids past that are never allowed. The schema asks for more items
than any request's output holds, so every request still runs its whole length (ignore_eos), through
keys, integers, short strings and enums over and over.
"""

import json
import tempfile
from dataclasses import replace
from pathlib import Path

from actors.executor.grammars import Grammars
from kernel.model_source import ModelUnavailable, default_gguf
from ops.bench.checkpoint import write_tokenizer
from ops.bench.inprocess import InProcessBench
from ops.bench.records import DecodeFigures, FeatureCost, OfflineFigures, Row
from ops.bench.requests import BenchRequest
from ops.bench.testbed import Testbed
from schemas.generate import Constraint

BIASED_TOKENS = 16
ALLOWED_TOKENS = 1024  # an action mask's size
DISALLOWED_TOKENS = 64
BENCH_SCHEMA = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "minItems": 10000,
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 0, "maximum": 999999},
                    "name": {"type": "string", "maxLength": 16},
                    "tags": {"type": "array", "maxItems": 4, "items": {"enum": ["red", "green", "blue"]}},
                },
                "required": ["id", "name", "tags"],
            },
        }
    },
    "required": ["items"],
}


def feature_fields(feature: str, vocab_size: int) -> dict:
    """The SamplingParams fields every request of the feature's run sets."""
    if feature == "logprobs":
        return {"logprobs": True, "top_logprobs": 5}
    if feature == "rules":
        step = vocab_size // ALLOWED_TOKENS
        return {
            "presence_penalty": 0.5,
            "frequency_penalty": 0.3,
            "repetition_penalty": 1.1,
            "logit_bias": {token: 1.0 for token in range(0, BIASED_TOKENS * 7, 7)},
            "allowed_token_ids": list(range(0, ALLOWED_TOKENS * step, step)),
            "disallowed_token_ids": list(range(1, DISALLOWED_TOKENS * step, step)),
        }
    if feature == "json_schema":
        return {"constraint": Constraint("json_schema", json.dumps(BENCH_SCHEMA))}
    raise ValueError(f"unknown feature {feature!r}; choose from {', '.join(FEATURES)}")


# Targets: a's step ratio, d's.
FEATURES = {"logprobs": ("<= 1.02", ">= 0.97"), "rules": ("", ">= 0.95"), "json_schema": ("", ">= 0.90")}
DETERMINISTIC_TARGETS = ("<= 1.15", ">= 0.87")


def grammar_tokenizer(out: Path, vocab_size: int) -> str:
    """Writes the tokenizer the JSON schema is compiled for into `out`; returns what it is. The
    default model's where its package is installed; else the benchmark checkpoint's (a small BPE
    padded with word-like filler), whose masks cost far less than a real one's."""
    try:
        gguf = default_gguf()
    except ModelUnavailable:
        write_tokenizer(out, vocab_size)
        return f"the benchmark's own tokenizer ({vocab_size} tokens, most of them filler words)"
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    return f"the default model's tokenizer ({gguf.name}), for a model of {vocab_size} token ids"


def measure_feature_cost(
    testbed: Testbed,
    feature: str,
    context: int,
    step_off: DecodeFigures,
    offline_off: OfflineFigures,
    offline: list[BenchRequest],
) -> FeatureCost:
    """Workloads a and d with `feature` on every request; `step_off` and `offline_off` are the same
    workloads of this run without it."""
    fields = feature_fields(feature, testbed.config.vocab_size)
    sampling = replace(testbed.args.sampling, more=fields)
    step_target, throughput_target = FEATURES[feature]
    with tempfile.TemporaryDirectory(prefix="bench-grammar-") as work:
        grammars = None
        if "constraint" in fields:  # compiled once, in a warm-up, before anything is timed
            testbed.report.note(f"{feature}: grammars for {grammar_tokenizer(Path(work), testbed.config.vocab_size)}")
            runner = testbed.runner
            grammars = Grammars(work, runner.vocab_size, runner.eos_token_ids)
        bench = InProcessBench(testbed, sampling, grammars)
        if grammars is not None:
            bench.warm_up([replace(request, output_tokens=4) for request in offline[:2]])
        step = bench.decode(f"a+{feature}", 1, context, 129, "")
        throughput = bench.throughput(f"d+{feature}", offline)
    cost = FeatureCost(feature, fields, step.wall_s, step_off.wall_s, throughput.output_tok_s, offline_off.output_tok_s)
    report_cost(testbed, cost, step_target, throughput_target)
    return cost


def measure_deterministic_cost(
    testbed: Testbed,
    context: int,
    step_off: DecodeFigures,
    offline_off: OfflineFigures,
    warm: list[BenchRequest],
    offline: list[BenchRequest],
) -> FeatureCost:
    """Workloads a and d on a runner with `--deterministic`'s batch-invariant kernels, built on the
    same weights (the same seed) once the default one is freed; `step_off` and `offline_off` are the
    default runner's figures of this run. The test bed keeps the deterministic runner."""
    testbed.free()
    testbed.build_runner(deterministic=True)
    bench = InProcessBench(testbed)
    bench.warm_up(warm)  # kernels compile and the allocator grows here, as for the default runner
    step = bench.decode("a+deterministic", 1, context, 129, "")
    throughput = bench.throughput("d+deterministic", offline)
    cost = FeatureCost(
        "deterministic", {}, step.wall_s, step_off.wall_s, throughput.output_tok_s, offline_off.output_tok_s
    )
    report_cost(testbed, cost, *DETERMINISTIC_TARGETS)
    return cost


def report_cost(testbed: Testbed, cost: FeatureCost, step_target: str, throughput_target: str) -> None:
    """The two rows of a feature's cost: a's step and d's throughput, with it and without."""
    feature = cost.feature
    testbed.report.add(
        Row(
            f"a+{feature}: batch-1 step with {feature} / without",
            f"{cost.step_s * 1e3:.3f} ms",
            f"{cost.step_off_s * 1e3:.3f} ms",
            f"{cost.step_s / cost.step_off_s:.3f}",
            step_target,
        )
    )
    testbed.report.add(
        Row(
            f"d+{feature}: offline throughput with {feature} / without",
            f"{cost.output_tok_s:,.0f} out tok/s",
            f"{cost.output_tok_s_off:,.0f} out tok/s",
            f"{cost.output_tok_s / cost.output_tok_s_off:.3f}",
            throughput_target,
        )
    )
