"""`ModelRunner.launch` with inputs that pool: each gets the sum of its last tokens' final hidden
states, whatever else the step runs; a step that pools nothing returns no sums; and an input that
would pool and draw at once, or pool more than it feeds, is refused before anything runs."""

import numpy as np
import pytest
import torch
from transformers import AutoModel

from gpu.runner import ModelRunner
from gpu.step_io import SequenceInput
from tests.gpu.decoding import BLOCK_SIZE, NUM_BLOCKS, random_prompt, shuffled_tables


@pytest.fixture(scope="module")
def model_dir(build_tiny_model):
    return build_tiny_model("llama")


def test_pooled_sums_are_the_final_hidden_states_of_the_tokens_asked(model_dir):
    runner = ModelRunner(model_dir, num_kv_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE)
    prompts = [random_prompt(n, seed=n) for n in (12, 5, 9)]
    tables = shuffled_tables([len(p) + 1 for p in prompts], seed=2)
    pending = runner.launch(
        [
            SequenceInput(prompts[0], 0, tables[0], sample=False, pooled_tokens=12),  # a mean's chunk: all
            SequenceInput(prompts[1], 0, tables[1], sample=True),  # a generation's prompt
            SequenceInput(prompts[2], 0, tables[2], sample=False, pooled_tokens=1),  # last-token pooling
        ]
    )
    pooled = pending.pooled()
    assert pooled[1] is None and pending.tokens()[1] is not None
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        states = [model(torch.tensor([p])).last_hidden_state[0].numpy() for p in prompts]
    np.testing.assert_allclose(pooled[0], states[0].sum(axis=0), atol=1e-4, rtol=1e-5)
    np.testing.assert_allclose(pooled[2], states[2][-1], atol=1e-5, rtol=1e-5)
    assert runner.launch([SequenceInput(prompts[1], 0, tables[1], sample=True)]).pooled() is None


@pytest.mark.parametrize("sample, pooled_tokens", [(True, 1), (False, 6)])
def test_an_input_that_pools_and_draws_or_pools_past_its_tokens_is_refused(model_dir, sample, pooled_tokens):
    runner = ModelRunner(model_dir, num_kv_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE)
    with pytest.raises(ValueError, match="input 1 pools"):
        runner.launch(
            [
                SequenceInput([5, 6, 7], 0, [0], sample=False),
                SequenceInput([8, 9, 10, 11, 12], 0, [1], sample=sample, pooled_tokens=pooled_tokens),
            ]
        )
