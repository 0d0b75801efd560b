"""Faults in the model's forward pass, for end-to-end tests through a real server.

A test puts this folder on the server's PYTHONPATH and names a folder in STEP_FAULTS_DIR. Python
imports this file in every process the supervisor starts; where `gpu.model` is imported (the
executor), its forward pass is wrapped, and each step it reads the folder:
- a file `hang`: the step hangs for good, and the file is removed, so the executor that the
  supervisor starts in its place runs.
"""

import importlib.abc
import importlib.util
import os
import sys
import threading
from pathlib import Path

FAULTS_DIR = os.environ.get("STEP_FAULTS_DIR")


def _with_faults(run_layers, faults: Path):
    def run_layers_with_faults(self, batch, kv):
        hang = faults / "hang"
        if hang.exists():
            hang.unlink()
            threading.Event().wait()  # a device call that never returns
        return run_layers(self, batch, kv)

    return run_layers_with_faults


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Finds `gpu.model` as the other finders do, and wraps its forward pass once it has run."""

    def find_spec(self, name, path, target=None):
        if name != "gpu.model":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module):
            exec_module(module)
            module.CausalLM.run_layers = _with_faults(module.CausalLM.run_layers, Path(FAULTS_DIR))

        spec.loader.exec_module = exec_and_wrap
        return spec


if FAULTS_DIR:
    sys.meta_path.insert(0, _WrapOnImport())
