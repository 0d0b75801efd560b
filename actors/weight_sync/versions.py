"""The weight version: which weights the executor serves, as the weight_sync actor (their one
owner) knows them, and how many updates it has committed.

A version is a string, as in SGLang: the executor's first weights are `--weight-version`
("default"); an update that names none gets the count of updates committed so far ("1", "2"...).
The count, the version and the checkpoint last loaded from disk are kept in a file, so a restarted
weight_sync actor names the next update after the last one and still knows where the weights the
executor serves came from; which version it serves is the executor's to say (`follow`).
"""

import os
from pathlib import Path

import msgspec


class SavedVersions(msgspec.Struct):
    committed: int = 0
    version: str | None = None
    model_path: str | None = None


class VersionBook:
    def __init__(self, state_file: Path, version: str) -> None:
        self.state_file = state_file
        self._saved = self._read()
        self.committed = self._saved.committed
        self.version = version  # what the executor serves, as last heard
        self.model_path: str | None = None  # the checkpoint last loaded from disk; None: the served model's

    def next_version(self, asked: str | None) -> str:
        """The version an update will commit: the one it names, else the count after this one."""
        return asked if asked is not None else str(self.committed + 1)

    def commit(self, version: str, model_path: str | None) -> None:
        """An update committed; `model_path`: the checkpoint it loaded from disk (None for others,
        which leave the last one named)."""
        self.version = version
        self.committed += 1
        self.model_path = model_path or self.model_path
        self._write()

    def rename(self, version: str) -> None:
        """The serving weights get another name (UpdateWeightVersion): no update is counted."""
        self.version = version
        self._write()

    def follow(self, served: str) -> bool:
        """The executor says it serves `served`; returns whether the book said otherwise. Weights
        saved under that version are the ones it serves (this actor restarted); others are the
        model's own (the executor restarted and loaded `--model` again)."""
        if served == self.version:
            return False
        self.version = served
        self.model_path = self._saved.model_path if served == self._saved.version else None
        self._write()
        return True

    def _read(self) -> SavedVersions:
        try:
            return msgspec.json.decode(self.state_file.read_bytes(), type=SavedVersions)
        except (OSError, msgspec.DecodeError):
            return SavedVersions()  # none yet (a corrupt file is rewritten at the next change)

    def _write(self) -> None:
        self._saved = SavedVersions(self.committed, self.version, self.model_path)
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        partial = self.state_file.with_name(self.state_file.name + ".partial")
        partial.write_bytes(msgspec.json.encode(self._saved))
        os.replace(partial, self.state_file)
