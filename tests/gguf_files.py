"""Writes a model directory as a GGUF file the way llama.cpp's convert_hf_to_gguf.py does, for the
tests of gpu/gguf_import.py: a file made here is what a user downloads, in miniature.

Only what the models of gpu/model_builder.py hold is covered: llama, qwen2, qwen3 and mistral with
untied embeddings, default RoPE and a byte-level BPE tokenizer.
"""

import json
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file

Q = gguf.GGMLQuantizationType

# HF model_type -> the architecture llama.cpp writes. It has no "mistral" of its own: a Mistral file
# says "llama", and only its general.name tells it apart.
_GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}

# Name of a tensor in a transformers checkpoint -> in GGUF; a layer's become blk.N.<name>.<weight|bias>.
_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",  # Qwen3
    "self_attn.k_norm": "attn_k_norm",  # Qwen3
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}

# llama.cpp names the way a tokenizer splits text before its merges, and readers pick the split
# by that name: gpu/tokenizer_builder.py gives qwen2 Qwen2's split, the others GPT-2's.
_TOKENIZER_PRE = {"qwen2": "qwen2"}
_GPT2_PRE = "gpt-2"

_FILE_TYPE = {Q.F32: gguf.LlamaFileType.ALL_F32, Q.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0}


def write_gguf_from_hf(model_dir: Path, out: Path, tensor_type: Q = Q.F32) -> Path:
    """Writes the model in `model_dir` to the GGUF file `out`, its matrices as `tensor_type` (F32 or
    Q8_0); returns `out`."""
    if tensor_type not in _FILE_TYPE:
        raise ValueError(f"tensor_type must be one of {[t.name for t in _FILE_TYPE]}, not {tensor_type.name}")
    config = json.loads((model_dir / "config.json").read_text())
    model_type = config["model_type"]
    writer = gguf.GGUFWriter(out, _GGUF_ARCH[model_type])
    # llama.cpp names the model from its card, else from the directory ("mistral" -> "Mistral").
    writer.add_name(gguf.Metadata.load(None, model_dir).name or model_dir.name)
    writer.add_file_type(_FILE_TYPE[tensor_type])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _add_hyperparameters(writer, config)
    _add_tokenizer(writer, model_dir, model_type)
    for name, tensor in load_file(model_dir / "model.safetensors").items():
        _add_tensor(writer, config, name, tensor, tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def _add_hyperparameters(writer: gguf.GGUFWriter, config: dict) -> None:
    """The keys TextModel.set_gguf_parameters writes, and LlamaModel's rope dimension and vocab size."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(config["rope_parameters"]["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if "head_dim" in config:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if _GGUF_ARCH[config["model_type"]] == "llama":
        writer.add_vocab_size(config["vocab_size"])
        writer.add_rope_dimension_count(head_dim)


def _add_tokenizer(writer: gguf.GGUFWriter, model_dir: Path, model_type: str) -> None:
    """As TextModel._set_vocab_gpt2: every token with its type, then the merges, special token ids,
    add_bos_token and chat template that gguf.SpecialVocab reads from the directory's files."""
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    by_id = {index: token for token, index in tokenizer["model"]["vocab"].items()}
    control = {added["id"] for added in tokenizer["added_tokens"] if added["special"]}
    by_id.update({added["id"]: added["content"] for added in tokenizer["added_tokens"]})
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(_TOKENIZER_PRE.get(model_type, _GPT2_PRE))
    writer.add_token_list([by_id[i] for i in range(len(by_id))])
    writer.add_token_types(
        [gguf.TokenType.CONTROL if i in control else gguf.TokenType.NORMAL for i in range(len(by_id))]
    )
    gguf.SpecialVocab(model_dir, load_merges=True, n_vocab=len(by_id)).add_to_gguf(writer, quiet=True)
    # SpecialVocab writes one end-of-sequence id; a chat model's end of turn goes in a key of its own.
    generation = json.loads((model_dir / "generation_config.json").read_text())
    writer.add_eot_token_id(generation["eos_token_id"][-1])


def _add_tensor(writer: gguf.GGUFWriter, config: dict, name: str, tensor: np.ndarray, tensor_type: Q) -> None:
    gguf_name = _gguf_tensor_name(name)
    if _GGUF_ARCH[config["model_type"]] == "llama":
        tensor = _permute_for_llama_cpp(config, gguf_name, tensor)
    # As in llama.cpp, vectors (norms, biases) stay F32 whatever the file type: they are a tiny
    # part of the file.
    stored_type = tensor_type if tensor.ndim > 1 and not gguf_name.endswith("_norm.weight") else Q.F32
    writer.add_tensor(gguf_name, gguf.quants.quantize(tensor, stored_type), raw_dtype=stored_type)


def _gguf_tensor_name(name: str) -> str:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    _, _, layer, rest = name.split(".", 3)  # model.layers.N.<module>.<weight|bias>
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{_LAYER_NAMES[module]}.{kind}"


def _permute_for_llama_cpp(config: dict, gguf_name: str, tensor: np.ndarray) -> np.ndarray:
    """llama.cpp rotates adjacent pairs where transformers rotates the two halves of each head, so
    its converter reorders the rows of q and k within each head (LlamaModel.permute); transformers'
    LlamaTensorProcessor undoes it on load."""
    if gguf_name.endswith("attn_q.weight"):
        heads = config["num_attention_heads"]
    elif gguf_name.endswith("attn_k.weight"):
        heads = config["num_key_value_heads"]
    else:
        return tensor
    rows = tensor.shape[0]
    return tensor.reshape(heads, 2, rows // heads // 2, *tensor.shape[1:]).swapaxes(1, 2).reshape(tensor.shape)
