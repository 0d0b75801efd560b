"""The bf16 GPU path (fused kernels, each attention backend, CUDA graphs) against transformers.

bf16 moves logits by about 1% of their spread, so a near-tie may break either way: each side's
chosen token must be in the other's top 5, and greedy outputs must agree wherever the choice is clear.
The models have head_dim 128, the size FlashInfer's prebuilt kernels serve.
"""

import pytest
import torch

from gpu.attention import BackendInputs
from gpu.batch import HostBatch
from gpu.forward_batch import ForwardBatch
from gpu.model_builder import build_model_dir
from gpu.runner import ModelRunner
from gpu.staging import Staging
from gpu.step_io import SequenceInput
from tests.devices import needs_cuda
from tests.gpu.decoding import BLOCK_SIZE, NUM_BLOCKS, assert_decoding_tracks, generate, random_prompt, shuffled_tables

pytestmark = [
    pytest.mark.gpu,
    needs_cuda,
]
ARCHS = ("llama", "qwen2", "qwen3", "mistral")
BACKENDS = ("torch", "flashinfer", "triton")


def needs(backend: str) -> None:
    if backend == "flashinfer":
        pytest.importorskip("flashinfer")


@pytest.fixture(params=["cuda_cores", "tensor_cores"])
def tensor_core_decode(request, monkeypatch):
    """FlashInfer's decode kernel for the backends a test builds, whatever their query-head group
    (4 in the hd128 models, which picks tensor cores): the tensor-core one or the CUDA-core one."""
    pytest.importorskip("flashinfer")
    from gpu.attention import flashinfer_backend

    tensor_cores = request.param == "tensor_cores"
    monkeypatch.setattr(flashinfer_backend, "TENSOR_CORE_DECODE_MIN_GROUP", 1 if tensor_cores else 1 << 30)
    return tensor_cores


@pytest.fixture(scope="session")
def hd128_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("hd128-models")
    return lambda arch: build_model_dir(root / arch, arch=arch, size="hd128", seed=5)


def runner_for(model_dir, backend: str, cuda_graphs: bool = False, sizes=(1, 2, 4, 8)) -> ModelRunner:
    return ModelRunner(
        model_dir,
        device="cuda",
        dtype="bfloat16",
        num_kv_blocks=NUM_BLOCKS,
        block_size=BLOCK_SIZE,
        attention_backend=backend,
        cuda_graphs=cuda_graphs,
        cuda_graph_batch_sizes=sizes,
        cuda_graph_token_counts=(64, 128),
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_decoding_tracks_transformers(arch, backend, hd128_model, hf_bf16):
    needs(backend)
    model_dir = hd128_model(arch)
    runner, hf = runner_for(model_dir, backend), hf_bf16(model_dir)
    prompts = [random_prompt(n, seed=n) for n in (5, 17, 40)]
    assert_decoding_tracks(runner, hf, prompts, 12)


def test_flashinfer_and_torch_backends_give_the_same_logits(hd128_model, tensor_core_decode):
    model_dir = hd128_model("llama")
    runners = {b: runner_for(model_dir, b) for b in BACKENDS}
    assert runners["flashinfer"].model.attention_backend.decode_tensor_cores == tensor_core_decode
    prompts = [random_prompt(n, seed=n) for n in (3, 16, 33)]
    tables = shuffled_tables([50, 50, 50], seed=2)
    logits = {}
    for name, runner in runners.items():
        with torch.inference_mode():
            prefill = runner.model(ForwardBatch.build(prompts, [0, 0, 0], tables, BLOCK_SIZE, "cuda"), runner.kv)
            decode = runner.model(
                ForwardBatch.build([[7], [8], [9]], [3, 16, 33], tables, BLOCK_SIZE, "cuda"), runner.kv
            )
            mixed = runner.model(
                ForwardBatch.build([[10], [11, 12, 13], [14]], [4, 17, 34], tables, BLOCK_SIZE, "cuda"), runner.kv
            )
            # Two decodes first, then a chunk: FlashInfer runs the two with its decode kernel.
            decodes_first = runner.model(
                ForwardBatch.build(
                    [[15], [16], [17, 18]], [5, 35, 20], [tables[0], tables[2], tables[1]], BLOCK_SIZE, "cuda"
                ),
                runner.kv,
            )
        logits[name] = torch.cat([prefill, decode, mixed, decodes_first])
    error = (logits["flashinfer"] - logits["torch"]).norm() / logits["torch"].norm()
    # Tensor-core kernels round attention weights to bf16 before they multiply V (as every prefill
    # kernel does); the CUDA-core decode kernel keeps them in float32.
    assert error.item() < (1.5e-2 if tensor_core_decode else 1e-2)


def test_cuda_graph_decode_gives_the_eager_tokens(hd128_model, tensor_core_decode):
    """Batches of 1..9 sequences (padded to 1, 2, 4, 8, or above the largest graph, eager), greedy
    and seeded sampling: the graph path draws exactly the eager path's tokens."""
    model_dir = hd128_model("llama")
    graphed, eager = runner_for(model_dir, "flashinfer", cuda_graphs=True), runner_for(model_dir, "flashinfer")
    assert graphed.graphs is not None and eager.graphs is None
    assert graphed.model.attention_backend.decode_tensor_cores == tensor_core_decode
    prompts = [random_prompt(n, seed=n) for n in (3, 9, 12, 20, 5, 7, 30, 2, 14)]
    arrivals = [0, 2, 3, 3, 5, 6, 6, 6, 8]  # the batch grows one or more at a time
    assert generate(graphed, prompts, 10, arrivals=arrivals) == generate(eager, prompts, 10, arrivals=arrivals)

    seeded = dict(sample=True, temperature=0.8, top_p=0.95, seed=42)
    steps = [[SequenceInput([5, 6, 7], 0, [1], **seeded)], [SequenceInput([8], 3, [1], output_index=1, **seeded)]]
    assert [graphed.step(s) for s in steps] == [eager.step(s) for s in steps]


def test_graph_replan_plans_what_flashinfer_plan_does(hd128_model, tensor_core_decode):
    """A captured decode graph is re-planned through FlashInfer's compiled planner directly
    (`GraphDecodes._replan`); its public plan() must leave the same plan and the same schedule in the
    workspace, for batches whose sequences differ in length, as steps do, and for a step of the
    shared-prefix kind, whose decode pass reads only what each row does not share."""
    from gpu.attention.flashinfer_backend import PLAIN_GRAPH, SHARED_PREFIX_GRAPH

    runner = runner_for(hd128_model("llama"), "flashinfer", cuda_graphs=True, sizes=(4,))
    backend = runner.model.attention_backend
    backend.min_spared_token_reads = 1  # two shared blocks among four rows are worth a pass here
    wrapper = backend.graph_decodes.wrappers[4]
    shared = [50, 51]  # the first two blocks of every row of the third batch
    batches = [  # (lengths, tables, the graph kind a replay picks)
        ([3, 40, 17, 100], shuffled_tables([3, 40, 17, 100], seed=3), PLAIN_GRAPH),
        ([200, 1, 64, 65], shuffled_tables([200, 1, 64, 65], seed=3), PLAIN_GRAPH),
        ([40, 70, 33, 48], [shared + [1], shared + [2, 3, 4], shared + [6], shared + [7]], SHARED_PREFIX_GRAPH),
    ]
    for lengths, tables, kind in batches:
        host = HostBatch.build([[7]] * 4, [n - 1 for n in lengths], tables, BLOCK_SIZE)
        plans = {}
        for direct in (True, False):
            backend.graph_decodes.direct_replan = direct
            with torch.inference_mode():  # as steps run; the wrappers' buffers are inference tensors
                wrapper._int_workspace_buffer.zero_()
                batch, _ = ForwardBatch.from_host(host, runner.staging)
                assert backend.prepare_graph(batch) == kind
            torch.cuda.synchronize()
            plans[direct] = (
                [int(x) for x in wrapper._plan_info],
                wrapper._int_workspace_buffer.clone(),
                wrapper._paged_kv_indptr_buf.clone(),
                wrapper._paged_kv_indices_buf.clone(),
                wrapper._paged_kv_last_page_len_buf.clone(),
            )
        assert plans[True][0] == plans[False][0]
        for direct_buffer, public_buffer in zip(plans[True][1:], plans[False][1:]):
            assert torch.equal(direct_buffer, public_buffer)


@pytest.mark.parametrize("backend", ["flashinfer", "triton"])
def test_prompt_steps_replayed_in_pieces_give_the_eager_tokens(hd128_model, backend):
    """Steps with prompt tokens, alone or beside decodes, padded to 64 or 128 tokens and replayed as
    graph pieces around eager attention, or above 128 run eagerly: the eager path's tokens."""
    needs(backend)
    model_dir = hd128_model("llama")
    graphed, eager = runner_for(model_dir, backend, cuda_graphs=True), runner_for(model_dir, backend)
    replayed = []
    run = graphed.prompt_graphs.run
    graphed.prompt_graphs.run = lambda batch: replayed.append(batch.host.num_tokens) or run(batch)
    assert (
        ModelRunner(
            model_dir,
            device="cuda",
            num_kv_blocks=NUM_BLOCKS,
            attention_backend=backend,
            cuda_graph_batch_sizes=(1,),
            cuda_graph_token_counts=(),
        ).prompt_graphs
        is None
    )  # none asked
    prompts = [random_prompt(n, seed=n) for n in (70, 9, 100, 33, 150)]
    arrivals = [0, 0, 2, 3, 5]
    assert generate(graphed, prompts, 8, arrivals=arrivals) == generate(eager, prompts, 8, arrivals=arrivals)
    assert set(replayed) == {64, 128}


def test_graph_replay_writes_only_its_sequences_blocks(hd128_model):
    needs("flashinfer")
    runner = runner_for(hd128_model("llama"), "flashinfer", cuda_graphs=True)
    runner.step([SequenceInput([5, 6, 7], 0, [3], sample=True)])
    before = [layer.clone() for layer in runner.kv.layers]
    runner.step([SequenceInput([8], 3, [3], sample=True)])  # batch 1 of a graph captured at 1
    runner.step(
        [
            SequenceInput([9], 4, [3], sample=True),
            SequenceInput([1], 0, [4], sample=True),
            SequenceInput([2], 0, [5], sample=True),
        ]
    )  # padded 3 -> 4: the pad row writes the scratch block
    runner.step(
        [SequenceInput(list(range(10, 30)), 0, [6, 7], sample=True), SequenceInput([4], 5, [3], sample=True)]
    )  # 21 tokens replayed at 64: the filler writes scratch
    for old, new in zip(before, runner.kv.layers):
        changed = (old != new).flatten(1).any(dim=1).nonzero().flatten().tolist()
        assert set(changed) <= {3, 4, 5, 6, 7, runner.kv.scratch_block}
        assert torch.equal(old[3, :, :3], new[3, :, :3])  # the cached prompt stays as it was


def test_prefill_calls_after_the_first_give_what_flashinfer_run_gives():
    """Under one plan, layers after the first call the compiled kernel with the arguments the
    first layer's public run() handed it: each layer's output, written into the given buffer, is
    bit for bit what run() gives for that layer's queries and cache, under each of two plans."""
    pytest.importorskip("flashinfer")
    from gpu.attention.flashinfer_backend import FlashInferAttention
    from gpu.kv_cache import KVCache

    heads, kv_heads, dim, layers = 8, 2, 128, 3
    kv = KVCache(layers, NUM_BLOCKS, BLOCK_SIZE, kv_heads, dim, torch.bfloat16, "cuda")
    generator = torch.Generator("cuda").manual_seed(0)
    for layer in kv.layers:
        layer.normal_(generator=generator)
    backend = FlashInferAttention(BackendInputs(heads, kv_heads, dim, torch.bfloat16, torch.device("cuda")))
    tables = shuffled_tables([37, 70], seed=4)
    # A whole prompt and a chunk over 20 cached tokens; then other lengths, a plan of another shape.
    for token_ids, starts in [([[1] * 37, [2] * 50], [0, 20]), ([[3] * 30, [4] * 9], [7, 61])]:
        host = HostBatch.build(token_ids, starts, tables, BLOCK_SIZE)
        batch, _ = ForwardBatch.from_host(host, Staging(torch.device("cuda")))
        queries = [
            torch.randn(host.num_tokens, heads, dim, device="cuda", dtype=torch.bfloat16, generator=generator)
            for _ in range(layers)
        ]
        backend.prepare(batch)
        assert backend._prefill._args is None  # a new plan starts over from run()
        outputs = [torch.full_like(q, float("nan")) for q in queries]
        for layer, (q, out) in enumerate(zip(queries, outputs)):
            assert backend.attend(layer, q, kv, out=out) is out
        public = backend._prefill.wrapper
        for layer, (q, out) in enumerate(zip(queries, outputs)):
            assert torch.equal(out, public.run(q, kv.layers[layer])), layer


def test_a_shared_prefix_read_once_gives_plain_attention(tensor_core_decode):
    """Decode rows that share leading blocks (and one that does not, and a prompt chunk after them):
    FlashInfer's two-pass attention matches the torch reference."""
    from gpu.attention.flashinfer_backend import FlashInferAttention
    from gpu.attention.torch_backend import TorchAttention
    from gpu.kv_cache import KVCache

    heads, kv_heads, dim = 8, 2, 128
    kv = KVCache(1, NUM_BLOCKS, BLOCK_SIZE, kv_heads, dim, torch.bfloat16, "cuda")
    kv.layers[0].normal_(generator=torch.Generator("cuda").manual_seed(0))
    shared = list(range(10))  # 160 tokens every sharing row starts with
    tables = [shared + [20], shared + [21, 22], [30, 31, 32], shared + [23], [40, 41]]
    token_ids = [[1], [1], [1], [1], [2] * 20]
    starts = [170, 190, 40, 160, 5]  # the last row: a 20-token chunk over 5 cached tokens
    host = HostBatch.build(token_ids, starts, tables, BLOCK_SIZE)
    batch, _ = ForwardBatch.from_host(host, Staging(torch.device("cuda")))
    q = torch.randn(host.num_tokens, heads, dim, device="cuda", dtype=torch.bfloat16)
    for decode_only in (False, True):
        step = (
            batch if not decode_only else ForwardBatch.build(token_ids[:4], starts[:4], tables[:4], BLOCK_SIZE, "cuda")
        )
        queries = q[: step.host.num_tokens]
        backend = FlashInferAttention(BackendInputs(heads, kv_heads, dim, torch.bfloat16, torch.device("cuda")))
        assert backend.decode_tensor_cores == tensor_core_decode
        backend.min_spared_token_reads = 0
        backend.prepare(step)
        assert backend._slots.tolist()[:4] == [0, 1, -1, 2], decode_only
        reference = TorchAttention(dim**-0.5)
        reference.prepare(step)
        expected = reference.attend(0, queries, kv)
        error = (backend.attend(0, queries, kv).float() - expected.float()).norm() / expected.float().norm()
        assert error.item() < 1e-2, (decode_only, error.item())


def test_graphs_that_read_shared_prefixes_once_give_the_eager_tokens(hd128_model, tensor_core_decode):
    """Four continuations of each of two 48-token prompts, interleaved, decode in a batch of 8 whose
    prompt blocks are their prompt's blocks; each is fed the plain kernels' tokens. The graph of
    the shared-prefix kind draws exactly the eager tokens, and those are the plain kernels' but for
    rare near-ties."""
    model_dir = hd128_model("llama")
    runners = {
        "plain": runner_for(model_dir, "flashinfer"),
        "eager": runner_for(model_dir, "flashinfer"),
        "graphs": runner_for(model_dir, "flashinfer", cuda_graphs=True),
    }
    for name in ("graphs", "eager"):
        runners[name].model.attention_backend.min_spared_token_reads = 0
    prompts = {(0, 1, 2): random_prompt(48, seed=1), (3, 4, 5): random_prompt(48, seed=2)}
    tables = [[*((0, 1, 2) if i % 2 else (3, 4, 5)), 10 + i] for i in range(8)]
    fed = None  # the plain runner's tokens, fed to all
    drawn = {}
    for name, runner in runners.items():
        runner.step([SequenceInput(prompt, 0, list(blocks), sample=False) for blocks, prompt in prompts.items()])
        tokens = runner.step(
            [SequenceInput(random_prompt(3, seed=10 + i), 48, t, sample=True) for i, t in enumerate(tables)]
        )
        drawn[name] = [tokens]
        for step in range(8):
            inputs = tokens if fed is None else fed[step]
            tokens = runner.step([SequenceInput([tok], 51 + step, t, sample=True) for tok, t in zip(inputs, tables)])
            drawn[name].append(tokens)
        backend = runner.model.attention_backend
        assert (backend._prefix_run is not None) == (name != "plain"), name
        if name != "plain":
            assert sorted(backend._slots.tolist()) == list(range(8))  # every row in one of the two groups
        fed = drawn["plain"]
    assert drawn["graphs"] == drawn["eager"]
    same = sum(a == b for plain, eager in zip(drawn["plain"], drawn["eager"]) for a, b in zip(plain, eager))
    assert same >= 0.95 * 72, drawn
