"""A request aborted and resubmitted under the same id with the tokens its client already has
(what the origin does after a crash) ends exactly as an uninterrupted run."""

import pytest

from actors.inprocess import InProcessEngine
from gpu.runner import ModelRunner
from schemas.generate import SamplingParams

PROMPT = list(range(40, 75))


def run(engine: InProcessEngine, request_id: str, tokens: dict[int, int], steps: int | None = None) -> None:
    """Steps the engine, keeping each drawn token by its output position (repeats must agree)."""
    done = 0
    while engine.busy and (steps is None or done < steps):
        for update in engine.step().updates:
            for offset, token in enumerate(update.token_ids):
                position = update.output_index + offset
                assert tokens.setdefault(position, token) == token, "a position drew two different tokens"
        done += 1


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=30, temperature=0.9, top_k=20, seed=5, ignore_eos=True),
    ],
)
@pytest.mark.parametrize("delivered", [0, 7])
def test_resubmission_continues_after_delivered_tokens(build_tiny_model, params, delivered):
    runner = ModelRunner(build_tiny_model("llama"), device="cpu", num_kv_blocks=64, block_size=4)
    reference: dict[int, int] = {}
    engine = InProcessEngine(runner, max_prefill_tokens=8)
    engine.submit("r", PROMPT, params)
    run(engine, "r", reference)

    tokens: dict[int, int] = {}
    engine = InProcessEngine(runner, max_prefill_tokens=8)
    engine.submit("r", PROMPT, params)
    while len(tokens) < delivered + 3:  # the run goes on a little past what the client received
        run(engine, "r", tokens, steps=1)
    engine.abort("r")
    assert engine.submit("r", PROMPT, params, output_ids=[tokens[i] for i in range(delivered)]) is None
    run(engine, "r", tokens)
    assert tokens == reference
    engine.batcher.kv.flush()
    assert engine.batcher.kv.pool.num_free == 64
