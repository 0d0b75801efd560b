"""What a feature of the hot path costs (`--feature-cost`): workloads a (the batch-1 decode step)
and d (offline throughput) rerun in the same run with every request using the feature, each beside
the run without it. Targets from issue 32: logprobs (sampled + top-5) keep d >= 0.97 and a within
+2%; penalties, a bias and a mask on every row keep d >= 0.95.
"""

from dataclasses import replace

from ops.bench.inprocess import InProcessBench
from ops.bench.records import DecodeFigures, FeatureCost, OfflineFigures, Row
from ops.bench.requests import BenchRequest
from ops.bench.testbed import Testbed

BIASED_TOKENS = 16
ALLOWED_TOKENS = 1024  # an action mask's size
DISALLOWED_TOKENS = 64


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
    raise ValueError(f"unknown feature {feature!r}; choose from {', '.join(FEATURES)}")


FEATURES = {"logprobs": ("<= 1.02", ">= 0.97"), "rules": ("", ">= 0.95")}  # targets: a's step ratio, d's


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
    bench = InProcessBench(testbed, sampling)
    step_target, throughput_target = FEATURES[feature]
    step = bench.decode(f"a+{feature}", 1, context, 129, "")
    throughput = bench.throughput(f"d+{feature}", offline)
    report = testbed.report
    report.add(
        Row(
            f"a+{feature}: batch-1 step with {feature} / without",
            f"{step.wall_s * 1e3:.3f} ms",
            f"{step_off.wall_s * 1e3:.3f} ms",
            f"{step.wall_s / step_off.wall_s:.3f}",
            step_target,
        )
    )
    report.add(
        Row(
            f"d+{feature}: offline throughput with {feature} / without",
            f"{throughput.output_tok_s:,.0f} out tok/s",
            f"{offline_off.output_tok_s:,.0f} out tok/s",
            f"{throughput.output_tok_s / offline_off.output_tok_s:.3f}",
            throughput_target,
        )
    )
    return FeatureCost(feature, fields, step.wall_s, step_off.wall_s, throughput.output_tok_s, offline_off.output_tok_s)
