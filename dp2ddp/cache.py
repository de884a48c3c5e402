"""A content-hash cache for ``dp2ddp lint`` (like ruff's): an unchanged file is
not analysed again.  One JSON file per configuration under ``.dp2ddp_cache/``
in the project (a ``.gitignore`` inside keeps it out of git); ``--no-cache``
turns it off.  The key covers the dp2ddp version and everything in the
configuration that changes a file's findings; the entry, the file's content.

Like git's index, an entry also keeps the file's size and modification time:
when both are unchanged and the file had not been modified in the two seconds
before it was hashed (so that a later edit must have moved its mtime), the file
is not even read.  Otherwise its content hash decides.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Mapping, Optional

from dp2ddp import __version__
from dp2ddp.codemods.rules import Diagnostic
from dp2ddp.files import SourceFiles

CACHE_DIR = ".dp2ddp_cache"
# a file modified this close to the time it was hashed may be modified again
# within the same mtime tick (coarse file systems tick in 2 s): its stat proves nothing
RACY_NS = 2_000_000_000


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

    def fresh(self, path: str, key) -> bool:
        """The file's (size, mtime_ns), taken before reading it, proves it unchanged."""
        entry = self.entries.get(os.path.abspath(path))
        return (
            entry is not None
            and key is not None
            and entry.get("stat") == list(key)
            and key[1] < entry.get("hashed_at", 0) - RACY_NS
        )

    def get(self, path: str, sources: Mapping[str, bytes]) -> Optional[List[Diagnostic]]:
        """The cached findings for ``path`` if the file is unchanged.  ``sources``
        maps paths to bytes; a ``SourceFiles`` also gives the stat taken before
        reading, which spares reading files the cache vouches for."""
        entry = self.entries.get(os.path.abspath(path))
        if entry is None:
            return None
        key = sources.stat(path) if isinstance(sources, SourceFiles) else None
        if not self.fresh(path, key):
            if entry["digest"] != self._digest(sources[path]):
                return None
            if key is not None:  # same content, new stat: vouch by stat from now on
                entry["stat"], entry["hashed_at"] = list(key), time.time_ns()
                self.dirty = True
        return [Diagnostic(**{**d, "path": path}) for d in entry["diagnostics"]]

    def put(self, path: str, sources: Mapping[str, bytes], diagnostics: List[Diagnostic]) -> None:
        key = sources.stat(path) if isinstance(sources, SourceFiles) else None
        self.entries[os.path.abspath(path)] = {
            "digest": self._digest(sources[path]),
            "stat": list(key) if key is not None else None,
            "hashed_at": time.time_ns(),
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
