"""Copies of KV blocks between the pool and host slots (gpu/kv_transfer.py): blocks saved to slots
and loaded back into other blocks are the same, every layer, K and V, through a real shared-memory
segment too. On the CPU, and (marked `gpu`) on CUDA, where the copies run on streams of their own
and must still be ordered with the step's work on the current stream."""

import uuid

import pytest
import torch

from actors.cache_tier.host_segment import HostSegment
from gpu.kv_cache import KVCache
from gpu.kv_transfer import KVTransfer
from tests.devices import needs_cuda

LAYERS, BLOCKS, BLOCK_SIZE, HEADS, HEAD_DIM = 3, 40, 4, 2, 8


def filled_pool(device: str, dtype: torch.dtype = torch.float32, num_blocks: int = BLOCKS) -> KVCache:
    """A pool whose every value is distinct, so a block in the wrong place shows."""
    kv = KVCache(LAYERS, num_blocks, BLOCK_SIZE, HEADS, HEAD_DIM, dtype, device)
    generator = torch.Generator().manual_seed(0)
    for layer in kv.layers:
        layer.copy_(torch.randn(layer.shape, generator=generator))
    return kv


def block_bytes(kv: KVCache) -> int:
    return KVCache.bytes_per_block(LAYERS, BLOCK_SIZE, HEADS, HEAD_DIM, kv.layers[0].dtype)


def blocks_of(kv: KVCache, blocks: list[int]) -> list[torch.Tensor]:
    return [layer[blocks].cpu() for layer in kv.layers]  # each [len(blocks), 2, block_size, heads, head_dim]


def slots_of(segment: HostSegment) -> torch.Tensor:
    """The segment's slots as the executor takes them."""
    return torch.from_numpy(segment.slots())


@pytest.fixture
def segment():
    name = f"test-kv-transfer-{uuid.uuid4().hex[:12]}"
    made = []

    def create(num_slots: int, slot_bytes: int) -> HostSegment:
        made.append(HostSegment.create(name, num_slots, slot_bytes))
        return made[-1]

    yield create
    for s in made:
        s.close()
        s.unlink()


def round_trip(kv: KVCache, transfer: KVTransfer, sources: list[int], slots: list[int], targets: list[int]):
    saved = transfer.save(sources, slots)
    saved.wait()
    assert saved.done()
    transfer.load(slots, targets)
    kv.arrivals.settle()  # as a step's stream does after its forward pass
    for layer, (before, after) in enumerate(zip(blocks_of(kv, sources), blocks_of(kv, targets))):
        assert torch.equal(before[:, 0], after[:, 0]), f"layer {layer}: K"
        assert torch.equal(before[:, 1], after[:, 1]), f"layer {layer}: V"


def test_scattered_blocks_come_back_the_same_into_other_blocks():
    kv = filled_pool("cpu")
    slots = torch.zeros(16, block_bytes(kv), dtype=torch.uint8)
    transfer = KVTransfer(kv, slots)
    round_trip(kv, transfer, [31, 2, 17, 8, 39], [9, 0, 15, 4, 5], [1, 20, 33, 11, 0])
    untouched = [b for b in range(BLOCKS) if b not in (1, 20, 33, 11, 0)]
    assert all(torch.equal(a, b) for a, b in zip(blocks_of(kv, untouched), blocks_of(filled_pool("cpu"), untouched)))


def test_a_slot_holds_every_layer_of_its_block_contiguously():
    kv = filled_pool("cpu", torch.bfloat16)
    slots = torch.zeros(4, block_bytes(kv), dtype=torch.uint8)
    KVTransfer(kv, slots).save([7], [2]).wait()
    held = slots[2].view(torch.bfloat16).view(LAYERS, 2, BLOCK_SIZE, HEADS, HEAD_DIM)
    assert all(torch.equal(held[i], kv.layers[i][7]) for i in range(LAYERS))
    assert slots[[0, 1, 3]].eq(0).all()


def test_blocks_go_through_a_shared_memory_segment_to_another_pool(segment):
    kv = filled_pool("cpu", torch.bfloat16)
    host = segment(8, block_bytes(kv))
    KVTransfer(kv, slots_of(host)).save([5, 30, 12], [7, 1, 4]).wait()
    other = KVCache(LAYERS, BLOCKS, BLOCK_SIZE, HEADS, HEAD_DIM, torch.bfloat16, "cpu")  # another executor's
    KVTransfer(other, slots_of(HostSegment.attach(host.name))).load([7, 1, 4], [0, 1, 2])
    for before, after in zip(blocks_of(kv, [5, 30, 12]), blocks_of(other, [0, 1, 2])):
        assert torch.equal(before, after)


@pytest.mark.parametrize("contiguous", [True, False])
def test_transfers_of_many_staging_chunks_come_back_the_same(monkeypatch, contiguous):
    kv = filled_pool("cpu")
    monkeypatch.setattr("gpu.kv_transfer.STAGING_BYTES", 6 * block_bytes(kv))  # 3 blocks a staging half
    rows = torch.zeros(BLOCKS, 2 * block_bytes(kv), dtype=torch.uint8)
    slots = rows[:, : block_bytes(kv)] if not contiguous else rows.view(-1)[: BLOCKS * block_bytes(kv)].view(BLOCKS, -1)
    transfer = KVTransfer(kv, slots)
    # Runs of consecutive slots (one copy each where rows are adjacent) across chunk boundaries.
    targets = [30, 31, 17, 18, 39, 38, 20, 21, 22, 23, 24, 25, 26, 27, 28, 19, 35]
    round_trip(kv, transfer, list(range(17)), [*range(2, 7), 30, *range(10, 15), 0, 1, 33, 34, 35, 36], targets)


@pytest.mark.parametrize(
    "blocks, slots, field",
    [
        ([1, 2], [1], "pair up"),
        ([BLOCKS], [0], "blocks"),  # the scratch block is no sequence's
        ([-1], [0], "blocks"),
        ([3, 3], [0, 1], "blocks"),
        ([3], [16], "slots"),
        ([3, 4], [5, 5], "slots"),
    ],
)
def test_blocks_and_slots_out_of_range_or_repeated_are_refused(blocks, slots, field):
    kv = filled_pool("cpu")
    transfer = KVTransfer(kv, torch.zeros(16, block_bytes(kv), dtype=torch.uint8))
    with pytest.raises(ValueError, match=field):
        transfer.save(blocks, slots)
    with pytest.raises(ValueError, match=field):
        transfer.load(slots, blocks)


def test_host_slots_of_another_size_are_refused():
    kv = filled_pool("cpu")
    with pytest.raises(ValueError, match="host_slots"):
        KVTransfer(kv, torch.zeros(4, block_bytes(kv) - 2, dtype=torch.uint8))
    with pytest.raises(ValueError, match="host_slots"):
        KVTransfer(kv, torch.zeros(4, block_bytes(kv) // 4, dtype=torch.float32))


def refill_after_the_load(kv: KVCache, host: torch.Tensor, step=lambda: None) -> None:
    """Loads slots saved from some blocks into others, after `step` (work queued before the load);
    once the load says it is done with the slots, another process may write them (the cache_tier's
    fetches): the loaded blocks keep what the slots held before."""
    transfer = KVTransfer(kv, host)
    sources, slots, targets = list(range(0, 16)), list(range(16)), list(range(20, 36))
    transfer.save(sources, slots).wait()
    step()
    loaded = transfer.load(slots, targets)
    loaded.wait()
    assert loaded.done()
    host[:16].fill_(0)  # no wait for the step: the load's reads are over
    for layer, (before, after) in enumerate(zip(blocks_of(kv, sources), blocks_of(kv, targets))):
        assert torch.equal(before, after), f"layer {layer}"
    transfer.close()


def test_a_load_is_done_once_it_has_read_its_slots_which_may_then_be_refilled():
    kv = filled_pool("cpu")
    refill_after_the_load(kv, torch.zeros(16, block_bytes(kv), dtype=torch.uint8))


@pytest.mark.gpu
@needs_cuda
def test_on_cuda_a_load_is_done_once_it_has_read_its_slots_which_may_then_be_refilled(segment, monkeypatch):
    kv = filled_pool("cuda", torch.bfloat16)
    monkeypatch.setattr("gpu.kv_transfer.STAGING_BYTES", 8 * block_bytes(kv))  # the save: 4 blocks a half, in turn
    # The step before the load, which the load waits for.
    refill_after_the_load(kv, slots_of(segment(16, block_bytes(kv))), step=lambda: torch.cuda._sleep(50_000_000))


@pytest.mark.gpu
@needs_cuda
def test_on_cuda_scattered_blocks_come_back_the_same_through_a_segment(segment, monkeypatch):
    kv = filled_pool("cuda", torch.bfloat16)
    monkeypatch.setattr("gpu.kv_transfer.STAGING_BYTES", 8 * block_bytes(kv))  # 4 blocks a staging half
    host = segment(BLOCKS, block_bytes(kv))
    transfer = KVTransfer(kv, slots_of(host))
    sources = torch.randperm(BLOCKS)[:18].tolist()
    slots = [3, 4, 5, 6, 0, 1, 2, *range(20, 31)]  # runs of consecutive slots and scattered ones
    targets = [b for b in torch.randperm(BLOCKS).tolist() if b not in sources][:18]
    round_trip(kv, transfer, sources, slots, targets)
    held = slots_of(host)[slots[0]].view(torch.bfloat16).view(LAYERS, 2, BLOCK_SIZE, HEADS, HEAD_DIM)
    assert all(torch.equal(held[i], kv.layers[i][sources[0]].cpu()) for i in range(LAYERS))
    transfer.close()


@pytest.mark.gpu
@needs_cuda
def test_on_cuda_a_save_sees_the_work_queued_before_it_and_the_next_step_sees_a_load(segment):
    kv = filled_pool("cuda", torch.bfloat16, num_blocks=256)
    host = segment(256, block_bytes(kv))
    transfer = KVTransfer(kv, slots_of(host))
    blocks, targets = list(range(0, 256, 2)), list(range(1, 256, 2))
    # Indices on the device beforehand: a list index would copy from pageable memory, and wait.
    target_index = torch.tensor(targets, device="cuda")
    # A first save of as many blocks: the pinned memory of its indices is allocated now, which may
    # wait for the device (cudaHostAlloc), and is reused by the save timed next.
    transfer.save(blocks, list(range(128))).wait()
    # The step's work, still running when the save is queued.
    torch.cuda._sleep(1_000_000_000)
    for layer in kv.layers:
        layer[0::2].fill_(7.0)  # the even blocks; index_fill_ would wait for the device (it checks the index)
    saved = transfer.save(blocks, list(range(128)))
    assert not saved.done()  # queued behind the sleep; the host did not wait
    saved.wait()
    assert slots_of(host)[:128].view(torch.bfloat16).eq(7.0).all()
    slots_of(host)[128:].view(torch.bfloat16).fill_(3.0)
    torch.cuda._sleep(50_000_000)  # the step before: the load's writes wait for it, then the next step for them
    transfer.load(list(range(128, 256)), targets)
    seen = []
    for i, layer in enumerate(kv.layers):  # as a forward pass reads them, layer by layer (no sync)
        kv.arrivals.wait_for(i)
        seen.append(layer.index_select(0, target_index).sum(dtype=torch.float32))
    kv.arrivals.settle()
    assert not kv.arrivals.pending
    per_layer = 128 * 2 * BLOCK_SIZE * HEADS * HEAD_DIM * 3.0
    assert [s.item() for s in seen] == [per_layer] * LAYERS
    transfer.close()


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_on_cuda_a_prompt_over_loaded_blocks_attends_over_each_layer_once_landed(
    build_tiny_model, segment, cuda_graphs
):
    """The prompt's forward pass (eager, or in pieces of CUDA graphs) runs while the load still
    lands: the same logits as over the blocks the prefix was computed in."""
    from gpu.runner import ModelRunner
    from gpu.step_io import SequenceInput

    runner = ModelRunner(
        build_tiny_model("llama"), device="cuda", num_kv_blocks=64, block_size=16, cuda_graphs=cuda_graphs
    )
    kv = runner.kv
    transfer = KVTransfer(kv, slots_of(segment(8, kv.block_bytes)))
    prefix = [(7 * i) % 200 + 3 for i in range(64)]  # four blocks
    tails = [[11, 12, 13], [14], [15, 16], [17, 18, 19, 20]]
    runner.step([SequenceInput(prefix, 0, [0, 1, 2, 3], sample=True)])

    def next_tokens(prefix_blocks: list[int]) -> list[int]:
        own = [[20 + k] for k in range(len(tails))]  # each tail's block after the prefix
        return runner.step([SequenceInput(t, 64, prefix_blocks + b, sample=True) for t, b in zip(tails, own)])

    expected = next_tokens([0, 1, 2, 3])
    transfer.save([0, 1, 2, 3], [4, 5, 6, 7]).wait()
    for layer in kv.layers:
        layer[[40, 41, 42, 43]] = 0.0
    with torch.cuda.stream(transfer._loads):  # a slow link: the step is launched long before the load lands
        torch.cuda._sleep(200_000_000)
    transfer.load([4, 5, 6, 7], [40, 41, 42, 43])
    assert next_tokens([40, 41, 42, 43]) == expected
    transfer.close()
