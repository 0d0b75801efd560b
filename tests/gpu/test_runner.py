"""ModelRunner's contract with the executor, and the batch and cache layout beneath it."""

import pytest
import torch

from gpu.batch import FROM_PREVIOUS_STEP, HostBatch
from gpu.forward_batch import ForwardBatch
from gpu.kv_cache import KVCache
from gpu.prompt_graphs import LayerPieces
from gpu.runner import ModelRunner
from gpu.step_io import SequenceInput


@pytest.fixture(scope="module")
def runner(build_tiny_model):
    return ModelRunner(build_tiny_model("llama"), num_kv_blocks=32, block_size=4)


def test_batch_flattens_sequences_and_maps_slots():
    # Sequence 0: 3 cached tokens, 3 new (positions 3..5) in blocks [7, 2]; sequence 1: a decode at 4 in [5, 1].
    batch = ForwardBatch.build([[10, 11, 12], [13]], [3, 4], [[7, 2], [5, 1]], block_size=4, device="cpu")
    assert batch.input_ids.tolist() == [10, 11, 12, 13]
    assert batch.positions.tolist() == [3, 4, 5, 4]
    assert batch.slot_mapping.tolist() == [7 * 4 + 3, 2 * 4 + 0, 2 * 4 + 1, 1 * 4 + 0]
    assert batch.query_start.tolist() == [0, 3, 4]
    assert batch.host.context_lens.tolist() == [6, 5]
    assert batch.logits_index.tolist() == [2, 3]
    # The pages each sequence reads, ragged: FlashInfer's paged-KV form.
    assert batch.kv_indptr.tolist() == [0, 2, 4] and batch.kv_indices.tolist() == [7, 2, 5, 1]
    assert batch.kv_last_page_len.tolist() == [2, 1]
    assert batch.input_ids.dtype == batch.kv_indices.dtype == torch.int32
    assert not batch.host.is_decode


def test_decode_batch_pads_onto_the_scratch_block():
    host = HostBatch.build([[13], [14]], [4, 0], [[5, 1], [3]], block_size=4)
    assert host.is_decode
    padded = host.padded(4, scratch_block=9)
    assert padded.num_seqs == 4 and padded.num_tokens == 4
    assert padded.token_data.tolist() == [13, 14, 0, 0, 4, 0, 0, 0, 1 * 4, 3 * 4, 9 * 4, 9 * 4]
    assert padded.kv_indptr.tolist() == [0, 2, 3, 4, 5] and padded.kv_indices.tolist() == [5, 1, 3, 9, 9]
    assert padded.kv_last_page_len.tolist() == [1, 1, 1, 1] and padded.logits_index.tolist() == [0, 1]


def test_eager_batch_grows_by_a_filler_sequence_on_the_scratch_block():
    host = HostBatch.build([[10, 11, 12], [13]], [3, 4], [[7, 2], [5, 1]], block_size=4)
    grown = host.with_filler(10, scratch_block=9)
    assert grown.num_tokens == 10 and grown.num_seqs == 3
    ids, positions, slots = grown.token_data.reshape(3, 10).tolist()
    assert ids == [10, 11, 12, 13, 0, 0, 0, 0, 0, 0] and positions == [3, 4, 5, 4, 0, 1, 2, 3, 4, 5]
    assert slots[4:] == [9 * 4 + p % 4 for p in range(6)]  # the scratch block only
    assert grown.query_start.tolist() == [0, 3, 4, 10]
    assert grown.kv_indptr.tolist() == [0, 2, 4, 6] and grown.kv_indices.tolist() == [7, 2, 5, 1, 9, 9]
    assert grown.kv_last_page_len.tolist() == [2, 1, 2] and grown.logits_index.tolist() == [2, 3]
    assert host.with_filler(4, scratch_block=9) is host


def test_filler_tokens_change_no_drawn_token_and_no_real_block(build_tiny_model):
    """What the runner does on CUDA to keep cuBLAS's shapes few, run on the CPU: the same tokens, and
    only the scratch block beyond the sequences' own."""
    steps = [
        [
            SequenceInput(list(range(20, 29)), 0, [0, 1, 2], sample=True),
            SequenceInput([5, 6, 7], 0, [3], sample=True, temperature=0.9, seed=3),
        ],
        [
            SequenceInput([40], 9, [0, 1, 2], sample=True),  # a decode beside a prompt chunk
            SequenceInput([8, 9], 3, [3, 4], sample=False),
        ],
    ]
    runs, fed = [], []
    for bucket in (1, 16):
        runner = ModelRunner(build_tiny_model("llama"), num_kv_blocks=8, block_size=4)
        runner.eager_token_bucket = bucket
        run_layers = runner.model.run_layers
        runner.model.run_layers = lambda batch, kv: fed.append(batch.host.num_tokens) or run_layers(batch, kv)
        runs.append(([runner.step(s) for s in steps], runner.kv.layers[-1][: runner.kv.scratch_block].clone()))
    assert fed == [12, 3, 16, 16]
    (tokens, blocks), (filled_tokens, filled_blocks) = runs
    assert filled_tokens == tokens
    # Equal up to float32 rounding (a product of another shape sums in another order)...
    assert torch.allclose(filled_blocks, blocks, rtol=0, atol=1e-4)
    assert filled_blocks[5:].abs().sum() == 0  # ...and the blocks no sequence has stay unwritten


def test_eager_forward_runs_a_step_without_drawing(build_tiny_model):
    """What the benchmark's kernel profile runs: a step's forward pass alone, again and again; the
    logits a greedy launch draws from, and no draw left for the next launch to read."""
    runner = ModelRunner(build_tiny_model("llama"), num_kv_blocks=8, block_size=4)
    seqs = [
        SequenceInput([20, 21, 22, 23, 24], 0, [0, 1], sample=True),
        SequenceInput([30, 31], 0, [2], sample=False),
        SequenceInput([40, 41, 42], 0, [3], sample=True, temperature=0.9, seed=1),
    ]
    forward = runner.eager_forward(seqs)
    logits = forward()
    assert logits.shape == (2, runner.vocab_size) and logits.dtype == torch.float32
    assert torch.equal(forward(), logits)
    tables = [s.block_table for s in seqs]
    whole = runner.model(ForwardBatch.build([s.token_ids for s in seqs], [0, 0, 0], tables, 4, "cpu"), runner.kv)
    assert torch.equal(whole[[0, 2]], logits)
    with pytest.raises(ValueError, match="none was launched"):
        runner.launch([SequenceInput([FROM_PREVIOUS_STEP], 5, [0, 1], sample=True, previous_row=0)])
    assert runner.step(seqs[:2]) == [logits[0].argmax().item(), None]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_layers_run_in_pieces_around_attention_give_the_whole_forward(build_tiny_model, arch):
    """The pieces prompt steps replay as CUDA graphs, run eagerly on the CPU: they meet only through
    fixed buffers larger than the step, and must give the whole forward pass's logits and KV."""
    runner = ModelRunner(build_tiny_model(arch), num_kv_blocks=8, block_size=4)
    host = HostBatch.build([[20, 21, 22, 23, 24], [40]], [0, 6], [[0, 1], [2, 3]], block_size=4)
    batch, _ = ForwardBatch.from_host(host.with_filler(8, runner.kv.scratch_block))
    whole = runner.model(batch, runner.kv)
    whole_kv = runner.kv.layers[-1].clone()
    runner.kv.layers[-1].zero_()
    pieces = LayerPieces(runner.model, runner.kv, max_tokens=16)
    assert pieces.num_pieces == runner.config.num_hidden_layers + 1
    runner.model.attention_backend.prepare(batch)
    assert torch.equal(runner.model.logits(pieces.forward(batch, pieces.run_piece), batch.logits_index), whole)
    assert torch.equal(runner.kv.layers[-1], whole_kv)


def test_cache_write_lands_in_the_mapped_slot():
    cache = KVCache(
        num_layers=2, num_blocks=3, block_size=4, num_kv_heads=2, head_dim=8, dtype=torch.float32, device="cpu"
    )
    k, v = torch.randn(2, 2, 8), torch.randn(2, 2, 8)
    cache.write(1, k, v, torch.tensor([2 * 4 + 1, 0 * 4 + 3]))
    # [blocks + scratch, K/V, block_size, kv_heads, head_dim], FlashInfer's NHD paged layout
    assert cache.layers[1].shape == (4, 2, 4, 2, 8)
    assert torch.equal(cache.layers[1][2, 0, 1], k[0]) and torch.equal(cache.layers[1][0, 1, 3], v[1])
    assert torch.equal(cache.keys(1)[2, 1], k[0]) and torch.equal(cache.values(1)[0, 3], v[1])
    assert torch.equal(cache.layers[1][0, 0, 3], k[1]) and torch.equal(cache.layers[1][2, 1, 1], v[0])
    assert torch.allclose(cache.layers[1].abs().sum(), k.abs().sum() + v.abs().sum())  # nothing else written
    assert cache.layers[0].abs().sum() == 0
    assert KVCache.bytes_per_block(2, 4, 2, 8, torch.bfloat16) == 2 * 2 * 4 * 2 * 8 * 2


def test_attributes(runner, build_tiny_model):
    assert (runner.device, runner.dtype, runner.block_size, runner.num_kv_blocks) == (
        torch.device("cpu"),
        torch.float32,
        4,
        32,
    )
    assert runner.max_model_len == 2048 and runner.vocab_size == 1024
    assert runner.eos_token_ids == [4, 1]  # <|eot_id|>, <|end_of_text|>
    sized = ModelRunner(
        build_tiny_model("llama"), kv_cache_bytes=10 * KVCache.bytes_per_block(2, 4, 2, 16, torch.float32), block_size=4
    )
    assert sized.num_kv_blocks == 10
    assert ModelRunner(build_tiny_model("llama")).num_kv_blocks == (256 << 20) // KVCache.bytes_per_block(
        2, 16, 2, 16, torch.float32
    )


def test_only_sampling_sequences_get_tokens(runner):
    assert runner.step([]) == []
    out = runner.step(
        [
            SequenceInput([5, 6, 7], 0, [0], sample=False),
            SequenceInput([8, 9], 0, [1], sample=True),
        ]
    )
    assert out[0] is None and isinstance(out[1], int) and 0 <= out[1] < runner.vocab_size


def test_seeded_draw_is_the_same_alone_and_in_a_batch(runner):
    prompt = [20, 21, 22, 23, 24, 25]
    seeded = dict(sample=True, temperature=1.0, top_p=0.9, top_k=50, seed=1234, output_index=3)
    alone = runner.step([SequenceInput(prompt, 0, [0, 1], **seeded)])
    crowd = runner.step(
        [
            SequenceInput([30, 31, 32], 0, [2], sample=True, temperature=0.7, seed=9),
            SequenceInput(prompt, 0, [4, 3], **seeded),
            SequenceInput([40], 0, [5], sample=True),
        ]
    )
    assert crowd[1] == alone[0]


def test_min_p_one_draws_the_greedy_token_at_any_temperature(runner):
    prompts = [[20 + i, 21, 22, 30 + i] for i in range(8)]

    def step(**sampling):
        return runner.step(
            [SequenceInput(p, 0, [i], seed=i, output_index=i, **sampling) for i, p in enumerate(prompts)]
        )

    greedy = step(sample=True)
    assert step(sample=True, temperature=2.0) != greedy  # so the sampler is really drawing
    assert step(sample=True, temperature=2.0, min_p=1.0) == greedy


def test_a_temperature_near_zero_draws_greedily(runner):
    """1e-40 would scale the logits to +-inf, where the draw would take the first positive one."""
    prompts = [[20 + i, 21, 22, 30 + i] for i in range(8)]

    def step(**sampling):
        return runner.step([SequenceInput(p, 0, [i], seed=i, sample=True, **sampling) for i, p in enumerate(prompts)])

    greedy = step()
    assert step(temperature=1e-40) == greedy
    assert step(temperature=1e-40, top_p=0.5, top_k=3) == greedy


def test_a_top_k_over_the_whole_vocabulary_is_off(runner, monkeypatch):
    """Off, it costs nothing; on, a row with a top-p too would size its head over the whole row."""
    seen = []
    sample = runner._sample
    monkeypatch.setattr(runner, "_sample", lambda logits, params: seen.append(params) or sample(logits, params))
    prompt = [20, 21, 22, 23]

    def step(top_k):
        settings = dict(sample=True, temperature=1.0, top_p=0.9, top_k=top_k, seed=5)
        return runner.step([SequenceInput(prompt, 0, [0], **settings)])

    assert step(runner.vocab_size + 1) == step(0)
    assert [params.largest_joint_top_k for params in seen] == [0, 0]


@pytest.mark.parametrize(
    "bad, message",
    [
        (SequenceInput([], 0, [0], sample=True), "empty"),
        (SequenceInput([1, 2, 3, 4, 5], 0, [0], sample=True), "block table of 1 blocks"),
        (SequenceInput([1], 4, [0], sample=True), "block table of 1 blocks"),
        (SequenceInput([1], 0, [32], sample=True), "block ids"),
        (SequenceInput([1], 0, [-1], sample=True), "block ids"),
        (SequenceInput([1024], 0, [0], sample=True), "token ids"),
        (SequenceInput([1], -1, [0], sample=True), "negative"),
        (SequenceInput([1], 2048, list(range(32)), sample=True), "max_model_len"),
    ],
)
def test_bad_input_is_rejected_before_any_work(runner, bad, message):
    before = runner.kv.layers[0].clone()
    with pytest.raises(ValueError, match=message):
        runner.step([SequenceInput([7], 0, [3], sample=True), bad])
    assert torch.equal(runner.kv.layers[0], before)


def test_unknown_dtype_is_rejected(build_tiny_model):
    with pytest.raises(ValueError, match="unknown dtype"):
        ModelRunner(build_tiny_model("llama"), dtype="float8", num_kv_blocks=4)
