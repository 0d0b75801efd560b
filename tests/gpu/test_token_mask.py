"""The token masks of constrained draws (gpu/token_mask.py): a cleared bit is a -inf logit and a set
one leaves the logit as it was, on the CPU (xgrammar's C++) and on CUDA (its Triton kernel, from
pinned memory) alike; and constrained requests on CUDA, where decodes replay CUDA graphs and the
masks are filled while the forward pass runs, follow their grammars beside free ones.
"""

import asyncio
import json

import httpx
import pytest
import torch
from transformers import AutoTokenizer

from actors.executor.grammars import Grammars
from actors.inprocess import InProcessEngine
from gpu.runner import ModelRunner
from gpu.token_mask import TokenMasks
from ops.local_server import start_server
from schemas.generate import Constraint, SamplingParams
from tests.devices import needs_cuda

VOCAB = 1000  # not a multiple of 32: the last word of a row is partly past the vocabulary


def random_bits(rows: int, seed: int) -> torch.Tensor:
    """[rows, words] int32 of random bits."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(-(2**31), 2**31 - 1, (rows, (VOCAB + 31) // 32), generator=generator, dtype=torch.int32)


def allowed(bits: torch.Tensor) -> torch.Tensor:
    """[rows, VOCAB] bool: whether each token's bit is set."""
    shifts = torch.arange(32, dtype=torch.int32)
    return ((bits[:, :, None] >> shifts) & 1).bool().reshape(bits.shape[0], -1)[:, :VOCAB]


def masked(device: str, logits: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    masks = TokenMasks(VOCAB, torch.device(device))
    out = logits.to(device)
    masks.apply(out, lambda host: host.copy_(bits))
    return out.cpu()


def test_a_cleared_bit_is_minus_infinity_and_the_rest_stays():
    logits = torch.randn(6, VOCAB)
    bits = random_bits(6, seed=1)
    out = masked("cpu", logits, bits)
    keep = allowed(bits)
    assert torch.equal(out[keep], logits[keep])
    assert torch.isneginf(out[~keep]).all()


def test_rows_the_filler_leaves_alone_are_all_allowed():
    logits = torch.randn(3, VOCAB)
    masks = TokenMasks(VOCAB, torch.device("cpu"))
    out = logits.clone()
    masks.apply(out, lambda host: host[1].zero_())  # row 1 may draw nothing; rows 0 and 2 anything
    assert torch.equal(out[[0, 2]], logits[[0, 2]]) and torch.isneginf(out[1]).all()
    out = logits[:2].clone()
    masks.apply(out, lambda host: None)  # a smaller step after a larger one: every bit set again
    assert torch.equal(out, logits[:2])


@pytest.mark.gpu
@needs_cuda
def test_the_cuda_mask_is_the_cpu_one():
    for rows, seed in ((1, 2), (7, 3), (300, 4)):  # the last grows the pinned buffer
        logits = torch.randn(rows, VOCAB)
        bits = random_bits(rows, seed)
        assert torch.equal(masked("cuda", logits, bits), masked("cpu", logits, bits))


@pytest.mark.gpu
@needs_cuda
def test_constrained_requests_on_cuda_follow_their_schema_beside_free_ones(build_tiny_model):
    model_dir = build_tiny_model("llama")
    runner = ModelRunner(model_dir, device="cuda", dtype="float32", num_kv_blocks=2048, block_size=16)
    assert runner.graphs is not None  # decodes replay graphs; the masks edit the graph's logits
    grammars = Grammars(model_dir, runner.vocab_size, runner.eos_token_ids)
    engine = InProcessEngine(runner, max_num_seqs=256, grammars=grammars)
    schema = {
        "type": "object",
        "properties": {
            "kind": {"enum": ["cat", "dog"]},
            "age": {"type": "integer", "minimum": 0, "maximum": 30},
            "name": {"type": "string", "maxLength": 12},
        },
        "required": ["kind", "age", "name"],
    }
    constraint = Constraint("json_schema", json.dumps(schema))
    for i in range(200):
        params = SamplingParams(max_tokens=200, temperature=1.0, seed=i, constraint=constraint)
        engine.submit(f"json-{i}", [(7 * i + k) % 900 + 5 for k in range(5)], params)
    for i in range(20):
        params = SamplingParams(max_tokens=40, temperature=1.0, seed=i, ignore_eos=True)
        engine.submit(f"free-{i}", [(3 * i + k) % 900 + 5 for k in range(5)], params)
    engine.run()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    for i in range(200):
        value = json.loads(tokenizer.decode(engine.outputs[f"json-{i}"], skip_special_tokens=True))
        assert set(value) == {"kind", "age", "name"} and value["kind"] in ("cat", "dog") and 0 <= value["age"] <= 30
        assert engine.finish_reasons[f"json-{i}"] == "stop"
    assert all(len(engine.outputs[f"free-{i}"]) == 40 for i in range(20))


@pytest.mark.gpu
@needs_cuda
async def test_constrained_requests_through_the_system_on_cuda(tmp_path, build_tiny_model):
    """The executor on CUDA launches on its event loop: a step with constrained draws waits there for
    the step before, then fills the masks while its forward pass runs."""
    server = start_server(tmp_path, "--device", "cuda", "--num-kv-blocks", "512", model=str(build_tiny_model("llama")))
    schema = {
        "type": "object",
        "properties": {"kind": {"enum": ["cat", "dog"]}, "age": {"type": "integer", "minimum": 0, "maximum": 30}},
        "required": ["kind", "age"],
    }
    try:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as client:
            constrained = [
                client.post("/v1/completions", json={"prompt": f"pet {i}", "max_tokens": 100, "guided_json": schema})
                for i in range(32)
            ]
            free = [
                client.post("/v1/completions", json={"prompt": f"go {i}", "max_tokens": 30, "ignore_eos": True})
                for i in range(8)
            ]
            replies = await asyncio.gather(*constrained, *free)
    finally:
        server.stop()
    assert all(reply.status_code == 200 for reply in replies), [r.text for r in replies if r.status_code != 200]
    for reply in replies[:32]:
        value = json.loads(reply.json()["choices"][0]["text"])
        assert value["kind"] in ("cat", "dog") and 0 <= value["age"] <= 30
    assert all(reply.json()["usage"]["completion_tokens"] == 30 for reply in replies[32:])
