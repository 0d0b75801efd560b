import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.gpu.weight_models import other_weights

ARCHS = ("llama", "qwen2", "qwen3", "mistral")


@pytest.fixture(scope="session", params=ARCHS)
def tiny_model_dir(request, build_tiny_model):
    """A tiny random model of each architecture (built once per session by tests/conftest.py)."""
    return build_tiny_model(request.param)


@pytest.fixture(scope="session")
def hf_greedy():
    """transformers' own greedy decoding of a model directory: the reference, EOS disabled."""
    models = {}

    def generate(model_dir, prompt: list[int], max_new_tokens: int) -> list[int]:
        if model_dir not in models:
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
            model.generation_config.eos_token_id = None
            models[model_dir] = model
        with torch.no_grad():
            out = models[model_dir].generate(
                torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0
            )
        return out[0, len(prompt) :].tolist()

    return generate


@pytest.fixture(scope="session")
def hf_bf16():
    """transformers' own model of a directory in bf16 on CUDA, EOS disabled: the GPU tests' reference."""
    models = {}

    def get(model_dir):
        if model_dir not in models:
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
            model.generation_config.eos_token_id = None
            models[model_dir] = model
        return models[model_dir]

    return get


@pytest.fixture(scope="module")
def llama(build_tiny_model):
    """The tiny llama the weight-update tests serve."""
    return build_tiny_model("llama")


@pytest.fixture(scope="module")
def llama_next(llama, tmp_path_factory):
    """Other weights of the same shape: what an update brings."""
    return other_weights(llama, tmp_path_factory.mktemp("next"), seed=11)
