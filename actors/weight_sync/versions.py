"""The weight version: which weights the executor serves, as the weight_sync actor (their one
owner) knows them, and how many updates it has committed.

A version is a string, as in SGLang: the executor's first weights are `--weight-version`
("default"); an update that names none gets the count of updates committed so far ("1", "2"...).
The count is kept in a file, so a restarted weight_sync actor names the next update after the last
one; the version itself is the executor's to say (it serves the weights), and is read back from it.
"""

import json
import os
from pathlib import Path


class VersionBook:
    def __init__(self, state_file: Path, version: str) -> None:
        self.state_file = state_file
        self.version = version  # what the executor serves, as last heard
        self.committed = self._read_count()

    def next_version(self, asked: str | None) -> str:
        """The version an update will commit: the one it names, else the count after this one."""
        return asked if asked is not None else str(self.committed + 1)

    def commit(self, version: str) -> None:
        self.version = version
        self.committed += 1
        self._write_count()

    def rename(self, version: str) -> None:
        """The serving weights get another name (UpdateWeightVersion): no update is counted."""
        self.version = version

    def _read_count(self) -> int:
        try:
            return int(json.loads(self.state_file.read_text())["committed"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0  # none yet (a corrupt file is rewritten at the next commit)

    def _write_count(self) -> None:
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        partial = self.state_file.with_name(self.state_file.name + ".partial")
        partial.write_text(json.dumps({"committed": self.committed}))
        os.replace(partial, self.state_file)
