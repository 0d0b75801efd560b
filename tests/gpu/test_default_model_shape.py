"""The default model's shape on the GPU: head_dim 64, three query heads to a KV head, tied
embeddings. Its real weights do not reach the GPU test machine, so random weights of its shape
(gpu/model_builder.py's `smollm2` size) stand in: bf16 decoding, CUDA graphs on, tracks
transformers on each attention backend, as the hd128 models do in test_flashinfer.py."""

import pytest

from gpu.model_builder import build_model_dir
from gpu.runner import ModelRunner
from tests.devices import needs_cuda
from tests.gpu.decoding import BLOCK_SIZE, NUM_BLOCKS, assert_decoding_tracks, random_prompt

pytestmark = [pytest.mark.gpu, needs_cuda]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp("smollm2-shape") / "model", arch="llama", size="smollm2", seed=5)


@pytest.mark.parametrize("backend", ["flashinfer", "triton"])
def test_bf16_decoding_tracks_transformers(model_dir, backend, hf_bf16):
    if backend == "flashinfer":
        pytest.importorskip("flashinfer")
    runner = ModelRunner(
        model_dir,
        device="cuda",
        dtype="bfloat16",
        num_kv_blocks=NUM_BLOCKS,
        block_size=BLOCK_SIZE,
        attention_backend=backend,
        cuda_graphs=True,
        cuda_graph_batch_sizes=(1, 2, 4),
        cuda_graph_token_counts=(64, 128),
    )
    assert runner.model.attention_backend.__class__.__name__.lower().startswith(backend)
    prompts = [random_prompt(n, seed=n, vocab=2000) for n in (5, 20, 37)]
    assert_decoding_tracks(runner, hf_bf16(model_dir), prompts, new_tokens=24)
