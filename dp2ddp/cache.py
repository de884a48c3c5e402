"""A content-hash cache for ``dp2ddp lint`` (like ruff's): an unchanged file is
not analysed again.  One JSON file per configuration under ``.dp2ddp_cache/``
in the project (a ``.gitignore`` inside keeps it out of git); ``--no-cache``
turns it off.  The key covers the dp2ddp version and everything in the
configuration that changes a file's findings; the entry, the file's content.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

from dp2ddp import __version__
from dp2ddp.codemods.rules import Diagnostic

CACHE_DIR = ".dp2ddp_cache"


class LintCache:
    def __init__(self, root: Path, config) -> None:
        key_material = json.dumps(
            {
                "version": __version__,
                "select": config.select,
                "ignore": config.ignore,
                "per_file_ignores": config.per_file_ignores,
                "root": str(config.root) if config.root else None,
            },
            sort_keys=True,
            default=str,
        )
        key = hashlib.sha256(key_material.encode()).hexdigest()[:16]
        self.directory = Path(root) / CACHE_DIR
        self.path = self.directory / f"lint-{key}.json"
        self.entries: Dict[str, dict] = {}
        self.dirty = False
        try:
            with open(self.path, encoding="utf-8") as handle:
                data = json.load(handle)
            if data.get("version") == __version__:
                self.entries = data.get("files", {})
        except (OSError, ValueError):
            pass

    @staticmethod
    def _digest(data: bytes) -> str:
        return hashlib.blake2b(data, digest_size=16).hexdigest()

    def get(self, path: str, data: bytes) -> Optional[List[Diagnostic]]:
        entry = self.entries.get(os.path.abspath(path))
        if entry is None or entry["digest"] != self._digest(data):
            return None
        return [Diagnostic(**{**d, "path": path}) for d in entry["diagnostics"]]

    def put(self, path: str, data: bytes, diagnostics: List[Diagnostic]) -> None:
        self.entries[os.path.abspath(path)] = {
            "digest": self._digest(data),
            "diagnostics": [{k: v for k, v in d.to_dict().items() if k != "path"} for d in diagnostics],
        }
        self.dirty = True

    def save(self) -> None:
        if not self.dirty:
            return
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            ignore = self.directory / ".gitignore"
            if not ignore.exists():
                ignore.write_text("# created by dp2ddp\n*\n")
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump({"version": __version__, "files": self.entries}, handle)
            os.replace(tmp, self.path)
        except OSError:
            pass  # a cache that cannot be written is only a slower next run
