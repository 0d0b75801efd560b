"""Turns a GGUF file (llama.cpp's format, which many people keep their models in) into a Hugging
Face model directory that the server loads like any other.

Transformers' GGUF support reads the file: it dequantizes every tensor to float32 and rebuilds
config.json, generation_config.json and the tokenizer with its chat template. The directory is
named by the file's SHA-256, so each file is converted once and a changed file again.

    python -m gpu.gguf_import FILE.gguf --models-dir DIR    # prints the model directory
"""

import argparse
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import gguf
from tqdm import tqdm

from gpu.config import ModelConfig
from gpu.model_dir import is_complete, write_once

# GGUF's names for the architectures our model code runs; Mistral's GGUF files say "llama".
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")
Q = gguf.GGMLQuantizationType
SUPPORTED_TYPES = (
    Q.F32,
    Q.F16,
    Q.BF16,
    Q.Q8_0,
    Q.Q4_0,
    Q.Q4_1,
    Q.Q5_0,
    Q.Q5_1,
    Q.Q2_K,
    Q.Q3_K,
    Q.Q4_K,
    Q.Q5_K,
    Q.Q6_K,
    Q.IQ4_NL,
    Q.IQ4_XS,
)
UNSUPPORTED_EXIT_CODE = 2
_HASH_CHUNK_BYTES = 16 << 20


class UnsupportedGguf(ValueError):
    """The file is not a GGUF file, or holds a model this server cannot convert or run."""


@dataclass(frozen=True)
class GgufHeader:
    """What the conversion takes from the file's header besides what transformers reads."""

    architecture: str
    head_dim: int | None  # <arch>.attention.key_length: transformers' reader leaves it out
    # Every token that ends generation: end of sequence, of turn, of message. GGUF keeps each in a
    # key of its own, and transformers reads only the first.
    end_token_ids: tuple[int, ...]
    bos_token_id: int | None
    add_bos_token: bool | None  # whether a plain encode starts with BOS
    control_tokens: dict[str, int]  # the special tokens (chat markers among them), each one id


def read_header(path: Path) -> GgufHeader:
    """Reads the file's header (not its tensors); raises UnsupportedGguf naming what is supported."""
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, OSError) as exc:
        raise UnsupportedGguf(f"{path} is not a readable GGUF file ({exc})") from None
    architecture = _field(reader, gguf.Keys.General.ARCHITECTURE)
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedGguf(
            f"{path.name}: architecture {architecture!r} is not supported; supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)} (Mistral models are stored as llama)"
        )
    unsupported = [t for t in reader.tensors if t.tensor_type not in SUPPORTED_TYPES]
    if unsupported:
        kinds = sorted({t.tensor_type.name for t in unsupported})
        raise UnsupportedGguf(
            f"{path.name}: tensors of type {', '.join(kinds)} ({unsupported[0].name} and {len(unsupported) - 1} more) "
            f"cannot be dequantized; supported: {', '.join(t.name for t in SUPPORTED_TYPES)}"
        )
    ends = [
        _field(reader, key)
        for key in (gguf.Keys.Tokenizer.EOS_ID, gguf.Keys.Tokenizer.EOT_ID, gguf.Keys.Tokenizer.EOM_ID)
    ]
    return GgufHeader(
        architecture,
        _field(reader, gguf.Keys.Attention.KEY_LENGTH.format(arch=architecture)),
        tuple(dict.fromkeys(token for token in ends if token is not None)),
        _field(reader, gguf.Keys.Tokenizer.BOS_ID),
        _field(reader, gguf.Keys.Tokenizer.ADD_BOS),
        _control_tokens(reader),
    )


def _control_tokens(reader: gguf.GGUFReader) -> dict[str, int]:
    tokens, types = _field(reader, gguf.Keys.Tokenizer.LIST), _field(reader, gguf.Keys.Tokenizer.TOKEN_TYPE)
    if tokens is None or types is None:
        return {}
    return {token: i for i, (token, kind) in enumerate(zip(tokens, types)) if kind == gguf.TokenType.CONTROL}


def _field(reader: gguf.GGUFReader, key: str):
    field = reader.get_field(key)
    return field.contents() if field is not None else None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with (
        open(path, "rb") as f,
        tqdm(total=path.stat().st_size, desc="Hashing GGUF", unit="B", unit_scale=True, disable=None) as progress,
    ):
        while chunk := f.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
            progress.update(len(chunk))
    return digest.hexdigest()


def import_gguf(path: str | Path, models_dir: str | Path) -> Path:
    """The model directory converted from `path` under `models_dir`, converting it if this file
    (by content) was never converted there."""
    path = Path(path).resolve()
    digest = file_sha256(path)
    target = Path(models_dir) / f"gguf-{digest[:16]}"  # a copy under another name is the same model
    if is_complete(target):
        return target
    header = read_header(path)
    return write_once(target, lambda staging: _convert(path, header, staging), {"gguf": str(path), "sha256": digest})


def _convert(path: Path, header: GgufHeader, out: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
        if header.head_dim and hasattr(config, "head_dim"):  # Qwen2's is always hidden_size / heads
            config.head_dim = header.head_dim
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, config=config, dtype=torch.float32
        )
    except (ValueError, KeyError, RuntimeError, NotImplementedError) as exc:
        raise UnsupportedGguf(f"{path.name}: transformers could not read it: {exc}") from None
    _special_tokens_as_the_file_says(tokenizer, header, path)
    _bos_as_the_file_says(tokenizer, header, path)
    # Transformers marks a model read from GGUF as quantized and will not save it, though what it
    # holds are plain float32 tensors: drop the mark, and the checkpoint is an ordinary one.
    model.hf_quantizer = None
    del model.config.quantization_config
    if header.end_token_ids:
        model.generation_config.eos_token_id = list(header.end_token_ids)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out, save_jinja_files=False)  # the template inside, as older transformers read it
    tokenizer_config_path = out / "tokenizer_config.json"
    tokenizer_config = json.loads(tokenizer_config_path.read_text())
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"  # a name every transformers version knows
    tokenizer_config_path.write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n")
    try:
        ModelConfig.from_pretrained(out)  # our model code's own check, before the directory is kept
    except ValueError as exc:
        raise UnsupportedGguf(f"{path.name} converts, but the server cannot run it: {exc}") from None


def _special_tokens_as_the_file_says(tokenizer, header: GgufHeader, path: Path) -> None:
    """Some transformers versions build a GGUF tokenizer that splits the file's control tokens
    (`<|im_start|>` and the like) into pieces of text: a chat prompt would then not be the one the
    model was trained on. Marking them special makes each encode as its own id again."""
    from tokenizers import AddedToken

    split = [
        token
        for token, id_ in header.control_tokens.items()
        if tokenizer.encode(token, add_special_tokens=False) != [id_]
    ]
    if not split:
        return
    tokenizer.add_tokens([AddedToken(token, special=True, normalized=False) for token in split], special_tokens=True)
    still = [
        token for token in split if tokenizer.encode(token, add_special_tokens=False) != [header.control_tokens[token]]
    ]
    if still:
        raise UnsupportedGguf(
            f"{path.name}: its special tokens {still[:4]} do not encode as themselves with this "
            "transformers version; upgrade transformers"
        )


def _bos_as_the_file_says(tokenizer, header: GgufHeader, path: Path) -> None:
    """Some transformers versions build a GGUF tokenizer without the file's BOS token, or one that
    never adds it whatever add_bos_token says: a Llama 3 prompt would then lack the token the model
    was trained to see first, and a chat template that writes {{ bos_token }} would write nothing."""
    from tokenizers import processors

    if header.bos_token_id is None:
        return
    bos = tokenizer.convert_ids_to_tokens(header.bos_token_id)
    if tokenizer.bos_token is None:  # chat templates write it as {{ bos_token }}
        tokenizer.bos_token = bos
    if not header.add_bos_token or tokenizer.encode("a")[:1] == [header.bos_token_id]:
        return
    prepend = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, header.bos_token_id)]
    )
    backend = tokenizer.backend_tokenizer
    existing = backend.post_processor
    backend.post_processor = prepend if existing is None else processors.Sequence([existing, prepend])
    if tokenizer.encode("a")[:1] != [header.bos_token_id]:
        raise UnsupportedGguf(
            f"{path.name}: its tokenizer must start with BOS, and this transformers version "
            "builds one that does not; upgrade transformers"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description="Convert a GGUF file into a Hugging Face model directory, once.")
    parser.add_argument("gguf", type=Path, help="the .gguf file")
    parser.add_argument("--models-dir", type=Path, required=True, help="where converted models are kept")
    args = parser.parse_args()
    try:
        print(import_gguf(args.gguf, args.models_dir))
    except (UnsupportedGguf, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(UNSUPPORTED_EXIT_CODE)


if __name__ == "__main__":
    main()
