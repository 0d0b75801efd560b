"""The served model's Hugging Face tokenizer, as transformers' AutoTokenizer would load it.

A checkpoint whose tokenizer_config.json names the generic fast tokenizer (this server's converted
GGUF models and built test models, and many published checkpoints) is loaded by that class
directly: AutoTokenizer, which picks the class, imports torch on its way (transformers' config
code), 1.1 s of CPU at every start of a process that has no other use for torch (the tokenizer).
Any other class is left to AutoTokenizer, which knows every model's own.
"""

import json
from pathlib import Path

GENERIC_CLASSES = ("PreTrainedTokenizerFast",)


def load_tokenizer(model_dir: str | Path):
    """The tokenizer of the checkpoint in `model_dir`."""
    try:
        named = json.loads((Path(model_dir) / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        named = None  # AutoTokenizer says what is wrong, in its words
    if named in GENERIC_CLASSES:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(model_dir)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)
