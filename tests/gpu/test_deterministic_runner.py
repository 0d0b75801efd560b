"""A whole model through `ModelRunner` with `deterministic=True`: a request's tokens and logprobs
are the same bits alone, beside other sequences, with its prompt chunked otherwise, and as the
prompt logprobs of its finished sequence fed back (teacher forcing).

On a CUDA GPU in bf16 with CUDA graphs; on the CPU in float32 with the invariant Triton kernels in
Triton's interpreter (their tile products made as blind to a row's place as a GPU's,
tests/gpu/tensor_cores.py). The big shapes and the whole engine are in test_determinism_cuda.py.
"""

import pytest

from gpu.runner import ModelRunner
from tests.devices import DEVICE, INTERPRETED, needs_triton
from tests.gpu.decoding import BLOCK_SIZE, NUM_BLOCKS, random_prompt
from tests.gpu.tensor_cores import row_blind_dot  # noqa: F401 (a fixture)
from tests.gpu.test_logprobs import Rollout, roll

pytestmark = [pytest.mark.gpu, needs_triton, pytest.mark.usefixtures("row_blind_dot")]

PROMPT = 270  # two of attention's splits
NEW_TOKENS = 3
SETTINGS = dict(temperature=1.0, seed=7, logprobs=True, top_logprobs=3)


def deterministic_runner(model_dir) -> ModelRunner:
    return ModelRunner(
        model_dir,
        device=DEVICE,
        dtype="float32" if INTERPRETED else "bfloat16",
        num_kv_blocks=NUM_BLOCKS,
        block_size=BLOCK_SIZE,
        deterministic=True,
    )


def neighbours() -> list[Rollout]:
    """Other sequences sharing the steps: prompts in chunks, then decodes."""
    return [
        Rollout(random_prompt(40, seed=1), 3, chunk=20, settings=dict(temperature=0.5, seed=2)),
        Rollout(random_prompt(9, seed=3), 4, chunk=9, settings=dict(logprobs=True), arrives=1),
        Rollout(random_prompt(70, seed=4), 2, chunk=70, arrives=2),
    ]


def test_a_request_is_the_same_bits_alone_in_a_batch_chunked_and_fed_back(build_tiny_model):
    runner = deterministic_runner(build_tiny_model("qwen3"))  # per-head norms before the rotation
    prompt = random_prompt(PROMPT, seed=11)
    alone = roll(runner, [Rollout(prompt, NEW_TOKENS, chunk=PROMPT, settings=SETTINGS)])[0]
    beside = roll(runner, [*neighbours(), Rollout(prompt, NEW_TOKENS, chunk=PROMPT, settings=SETTINGS, arrives=1)])
    chunked = roll(runner, [Rollout(prompt, NEW_TOKENS, chunk=90, settings=SETTINGS), *neighbours()], seed=3)
    for other in (beside[-1], chunked[0]):
        assert other.output == alone.output
        assert other.drawn == alone.drawn  # logprob, top ids, top logprobs, each float bit for bit
    sequence = prompt + alone.output
    fed_back = roll(runner, [Rollout(sequence, 1, chunk=140, settings=dict(top_logprobs=3), score_from=PROMPT)])[0]
    for j, drawn in enumerate(alone.drawn):
        logprob, top_ids, top_logprobs, _ = fed_back.scored[PROMPT + j]
        assert (logprob, top_ids, top_logprobs) == (drawn.logprobs[0], drawn.top_ids[0], drawn.top_logprobs[0])


def test_the_flag_takes_the_invariant_operators_and_refuses_other_attention(build_tiny_model):
    from gpu.invariant import INVARIANT_OPERATORS
    from gpu.invariant.attention import InvariantAttention

    runner = deterministic_runner(build_tiny_model("llama"))
    assert isinstance(runner.model.attention_backend, InvariantAttention)
    assert runner.model.model.layers[1].mlp.operators is INVARIANT_OPERATORS
    with pytest.raises(ValueError, match="attention backend 'triton' cannot serve --deterministic"):
        ModelRunner(build_tiny_model("llama"), device=DEVICE, attention_backend="triton", deterministic=True)
