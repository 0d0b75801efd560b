"""What the live-weights tests do as a trainer and a rollout client would: ask the weight_sync actor
over the bus, stream generations with their versions, and compute what the served weights must
produce (transformers, or the in-process engine when weights change mid-request)."""

import asyncio

import msgspec
import torch
from transformers import AutoModelForCausalLM

from actors.inprocess import InProcessEngine
from gpu.host_weights import HostWeights
from gpu.runner import ModelRunner
from gpu.weight_receiver import WeightReceiver
from ops.bus_client import stream_generate
from schemas.admin_weights import WeightsReply, WeightsRequest
from schemas.errors import Error
from schemas.generate import GenerateChunk, GenerateRequest, GenerateResult
from tests.sampling import greedy


async def ask(nc, message: WeightsRequest, timeout_s: float = 120.0) -> WeightsReply | Error:
    reply = await nc.request("llm.admin.weights", msgspec.msgpack.encode(message), timeout=timeout_s)
    return msgspec.msgpack.decode(reply.data, type=WeightsReply | Error)


async def admin(nc, subject: str, message, reply_type, timeout_s: float = 30.0):
    reply = await nc.request(f"llm.admin.{subject}", msgspec.msgpack.encode(message), timeout=timeout_s)
    return msgspec.msgpack.decode(reply.data, type=reply_type | Error)


async def generate(nc, prompt: list[int], max_tokens: int) -> GenerateResult:
    request = GenerateRequest(input_ids=prompt, params=greedy(max_tokens))
    reply = await nc.request("llm.generate", msgspec.msgpack.encode(request), timeout=120)
    result = msgspec.msgpack.decode(reply.data, type=GenerateResult | Error)
    assert isinstance(result, GenerateResult), result
    return result


async def streamed(nc, prompt: list[int], max_tokens: int, started: asyncio.Event) -> tuple[list, GenerateResult]:
    """A streamed greedy request's chunks and result; sets `started` once two tokens came."""
    chunks: list[GenerateChunk] = []
    async for reply in stream_generate(nc, GenerateRequest(input_ids=prompt, params=greedy(max_tokens))):
        if isinstance(reply, GenerateResult):
            return chunks, reply
        chunks.append(reply)
        if sum(len(c.token_ids) for c in chunks) >= 2:
            started.set()
    raise AssertionError("the stream ended without a result")


class Reference:
    """Greedy tokens of a checkpoint directory, by transformers."""

    def __init__(self, model_dir) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.model.generation_config.eos_token_id = None

    def __call__(self, prompt: list[int], max_tokens: int) -> list[int]:
        with torch.no_grad():
            out = self.model.generate(
                torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False, pad_token_id=0
            )
        return out[0, len(prompt) :].tolist()


def swapped_mid_request(old_dir, new_dir, prompt: list[int], max_tokens: int, switch_at: int) -> list[int]:
    """The greedy tokens of one request whose first `switch_at` tokens the old weights draw, and the
    rest the new ones, its KV kept (an in-place update): the in-process engine, the weights swapped
    between two steps, as the executor swaps them."""
    runner = ModelRunner(old_dir, device="cpu", num_kv_blocks=64, block_size=16)
    engine = InProcessEngine(runner, prefix_caching=False, overlap=False)
    engine.submit("r", prompt, greedy(max_tokens))
    while len(engine.outputs["r"]) < switch_at:
        engine.step()
    assert len(engine.outputs["r"]) == switch_at  # one token a step once decoding
    WeightReceiver(runner.model, HostWeights(runner.model), "cpu").apply_disk(new_dir)
    engine.run()
    return engine.outputs["r"]
