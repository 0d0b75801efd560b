"""Model directories the server writes for itself (the demo model, converted GGUF files).

Each is written whole in a staging directory beside its place and renamed into it, with a marker
file saying it is complete, so a crash never leaves half a model and a later start reuses it.
"""

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

COMPLETE_MARKER = ".complete"


def is_complete(path: str | Path) -> bool:
    return (Path(path) / COMPLETE_MARKER).is_file()


def write_once(path: str | Path, write: Callable[[Path], None], description: dict) -> Path:
    """Runs `write(staging)` and renames the staging directory to `path`; returns at once if a
    complete model is already there. `description` goes into the marker file.

    Two writers racing for the same path both end with one whole model.
    """
    path = Path(path)
    if is_complete(path):
        return path
    if path.exists() and any(path.iterdir()):
        raise FileExistsError(f"{path} exists and does not hold a complete built model; remove it or pick another path")
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.building-", dir=path.parent))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide the model from other users of a shared cache
    try:
        write(staging)
        for written in staging.iterdir():
            written.chmod(0o644)  # some writers make their files private; the model is for every user
        (staging / COMPLETE_MARKER).write_text(json.dumps(description) + "\n")
        try:
            staging.rename(path)  # replaces an empty directory; fails on a non-empty one
        except OSError:
            if not is_complete(path):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path
