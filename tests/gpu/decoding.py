"""Greedy decoding through `ModelRunner.step` the way the executor drives it, and the check that
it tracks transformers' own in a reduced precision, for the tests."""

import dataclasses
import random

import numpy as np
import torch

from gpu.batch import HostBatch
from gpu.forward_batch import ForwardBatch
from gpu.staging import Staging
from gpu.step_io import SequenceInput

BLOCK_SIZE = 16
NUM_BLOCKS = 64


def shuffled_tables(lengths: list[int], seed: int) -> list[list[int]]:
    """Disjoint block tables drawn in random order from the pool, each covering its length."""
    pool = list(range(NUM_BLOCKS))
    random.Random(seed).shuffle(pool)
    tables = []
    for length in lengths:
        count = -(-length // BLOCK_SIZE)
        tables.append(pool[:count])
        pool = pool[count:]
    return tables


def generate(runner, prompts, max_new_tokens, chunk_size=None, arrivals=None, seed=0) -> list[list[int]]:
    """Greedy decoding of several prompts through runner.step, one step per token: each step feeds
    every started sequence's next prompt chunk or its last drawn token."""
    arrivals = arrivals or [0] * len(prompts)
    tables = shuffled_tables([len(p) + max_new_tokens for p in prompts], seed)
    fed = [0] * len(prompts)
    outputs: list[list[int]] = [[] for _ in prompts]
    step = 0
    while any(len(out) < max_new_tokens for out in outputs):
        inputs, owners = [], []
        for i, prompt in enumerate(prompts):
            if arrivals[i] > step or len(outputs[i]) == max_new_tokens:
                continue
            if fed[i] < len(prompt):
                chunk = prompt[fed[i] : fed[i] + (chunk_size or len(prompt))]
                last_chunk = fed[i] + len(chunk) == len(prompt)
                inputs.append(SequenceInput(chunk, fed[i], tables[i], sample=last_chunk))
            else:
                inputs.append(SequenceInput([outputs[i][-1]], fed[i], tables[i], sample=True))
            owners.append(i)
        for i, given, token in zip(owners, inputs, runner.step(inputs)):
            fed[i] += len(given.token_ids)
            if token is not None:
                outputs[i].append(token)
        step += 1
    return outputs


def random_prompt(length: int, seed: int, vocab: int = 1024) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(5, vocab) for _ in range(length)]


def assert_decoding_tracks(runner, hf, prompts: list[list[int]], new_tokens: int, top: int = 5) -> None:
    """In bf16 or fp16 rounding moves logits by about 1% of their spread, so a near-tie may break
    either way: each side's greedy token must be among the other's `top`, judged on the side's own
    history, and the two greedy outputs must agree wherever the choice is clear. Our side decodes
    the prompts together, with chunked prefill beside decodes."""
    ours = generate(runner, prompts, new_tokens, chunk_size=16, arrivals=list(range(len(prompts))))
    for prompt, our_tokens in zip(prompts, ours):
        theirs = _hf_greedy(hf, prompt, new_tokens)
        their_logits = _hf_logits_at_every_position(hf, prompt + our_tokens)[len(prompt) - 1 : -1]
        assert all(_in_top(their_logits, our_tokens, top)), (our_tokens, theirs)
        our_logits = _our_logits_at_every_position(runner, prompt + theirs)[len(prompt) - 1 : -1]
        assert all(_in_top(our_logits, theirs, top)), (our_tokens, theirs)
        diverged = next((i for i, (a, b) in enumerate(zip(our_tokens, theirs)) if a != b), None)
        if diverged is not None:
            row = their_logits[diverged]
            margin = (row[theirs[diverged]] - row[our_tokens[diverged]]).abs().item()
            assert margin < 0.05 * row.std().item(), (diverged, our_tokens, theirs)


def _our_logits_at_every_position(runner, tokens: list[int]) -> torch.Tensor:
    """One prefill of `tokens` returning the logits of every position: [len(tokens), vocab]."""
    host = HostBatch.build([tokens], [0], shuffled_tables([len(tokens)], seed=7), BLOCK_SIZE)
    host = dataclasses.replace(host, logits_index=np.arange(len(tokens), dtype=np.int32))
    staging = Staging(runner.device) if runner.device.type == "cuda" else None  # the CPU's batches need none
    batch, _ = ForwardBatch.from_host(host, staging)
    with torch.inference_mode():
        return runner.model(batch, runner.kv)


def _hf_logits_at_every_position(hf, tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return hf(torch.tensor([tokens], device=hf.device)).logits[0].float()


def _hf_greedy(hf, prompt: list[int], max_new_tokens: int) -> list[int]:
    with torch.inference_mode():
        out = hf.generate(
            torch.tensor([prompt], device=hf.device), max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0
        )
    return out[0, len(prompt) :].tolist()


def _in_top(logits: torch.Tensor, tokens: list[int], top: int) -> list[bool]:
    """logits: [n, vocab] at the positions that chose `tokens`."""
    indices = logits.topk(top, dim=-1).indices
    return [token in row for token, row in zip(tokens, indices.tolist())]
