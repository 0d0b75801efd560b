"""Faults in the model's forward pass, for end-to-end tests through a real server.

A test puts this folder on the server's PYTHONPATH and names a folder in STEP_FAULTS_DIR. Python
imports this file in every process the supervisor starts; where `gpu.model` is imported (the
executor), each decoder layer's first half is wrapped to read the folder on every step:
- a file `hang`: the step hangs for good in its first layer, and the file is removed, so the
  executor that the supervisor starts in its place runs;
- a file `pause`: a step waits in its first layer while the file exists, and says so by a file
  `paused` for that time, so a test can act while the executor is inside a step;
- a file `oom_above_tokens` holding a number: a step of more tokens raises torch.OutOfMemoryError
  in its second layer, after the first wrote its KV, as a forward pass that allocates its
  activations as it goes runs out of device memory.
"""

import importlib.abc
import importlib.util
import os
import sys
import threading
import time
from pathlib import Path

FAULTS_DIR = os.environ.get("STEP_FAULTS_DIR")


def _with_faults(query, faults: Path):
    def query_with_faults(self, x, residual, rope, kv):
        layer = self.self_attn.layer_index
        hang, pause, oom_above = faults / "hang", faults / "pause", faults / "oom_above_tokens"
        if layer == 0 and hang.exists():
            hang.unlink()
            threading.Event().wait()  # a device call that never returns
        if layer == 0 and pause.exists():
            paused = faults / "paused"
            paused.touch()
            while pause.exists():
                time.sleep(0.01)
            paused.unlink()
        if layer == 1 and oom_above.exists() and x.shape[0] > int(oom_above.read_text()):
            import torch

            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate the activations of {x.shape[0]} tokens"
            )
        return query(self, x, residual, rope, kv)

    return query_with_faults


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Finds `gpu.model` as the other finders do, and wraps its layers once it has run."""

    def find_spec(self, name, path, target=None):
        if name != "gpu.model":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module):
            exec_module(module)
            module.DecoderLayer.query = _with_faults(module.DecoderLayer.query, Path(FAULTS_DIR))

        spec.loader.exec_module = exec_and_wrap
        return spec


if FAULTS_DIR:
    sys.meta_path.insert(0, _WrapOnImport())
