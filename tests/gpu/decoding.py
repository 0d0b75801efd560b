"""Greedy decoding through `ModelRunner.step` the way the executor drives it, for the tests."""

import random

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
