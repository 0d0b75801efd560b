"""The logprob kernels (gpu/logprob_kernel.py) give the torch path's logprobs and the same top ids,
ties ranked by lower id over the whole row; on the CPU in Triton's interpreter, small shapes."""

import pytest
import torch

from gpu.logprob_kernel import BLOCK, token_logprobs_on_gpu
from gpu.logprobs import ranked_top
from tests.devices import DEVICE, needs_triton

pytestmark = [pytest.mark.gpu, needs_triton]


def reference(logits: torch.Tensor, tokens: torch.Tensor, top: int, ids: torch.Tensor) -> torch.Tensor:
    logprobs = logits.log_softmax(dim=-1)
    top_ids = ranked_top(logprobs, top)
    chosen = torch.cat([tokens[:, None], top_ids, ids], dim=1)
    return torch.cat([logprobs.gather(1, chosen), top_ids.float()], dim=1)


@pytest.mark.parametrize("top, asked", [(0, 0), (1, 0), (5, 2), (20, 3)])
def test_kernels_give_the_torch_paths_logprobs_and_top_ids(top, asked):
    generator = torch.Generator().manual_seed(top)
    vocab = 2 * BLOCK + 300  # a last block cut short
    logits = torch.randn(5, vocab, generator=generator) * 4
    logits[1, 7:30] = logits[1].max() + 1  # 23 tokens tie for the best, across no block's end
    logits[2, BLOCK - 3 : BLOCK + 9] = logits[2].max() + 1  # and across one
    logits[3] = float("-inf")  # a row the filters left with three tokens, the rest tying at -inf
    logits[3, [vocab - 1, 5, BLOCK]] = torch.tensor([0.5, 0.0, -0.0])
    logits[4, :BLOCK] = float("-inf")  # a block all -inf
    tokens = torch.tensor([0, 8, BLOCK, 5, vocab - 1])
    ids = torch.randint(vocab, (5, asked), generator=generator)
    found = token_logprobs_on_gpu(logits.to(DEVICE), tokens.to(DEVICE), top, ids.to(DEVICE)).cpu()
    wanted = reference(logits, tokens, top, ids)
    assert found.shape == wanted.shape == (5, 1 + 2 * top + asked)
    assert torch.equal(found[:, 1 + top + asked :], wanted[:, 1 + top + asked :])  # the same top ids
    assert torch.allclose(found[:, : 1 + top + asked], wanted[:, : 1 + top + asked], atol=1e-5, rtol=0)
