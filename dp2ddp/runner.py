"""A convert run on the file system: discover, read, convert, write.

Separated from the CLI so that tests and other tools (``lint --fix``,
``convert --verify``) drive the same code path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from dp2ddp.codemods._base import Settings
from dp2ddp.engine import ConvertResult, FileResult, convert_sources
from dp2ddp.files import ConcurrentModification, DiscoveryError, digest, discover, write_atomic


class ConvertRun:
    class UsageError(Exception):
        """Bad paths or options (exit code 2)."""

    def __init__(
        self,
        paths: Sequence[Path],
        settings: Settings = Settings(),
        exclude: Sequence[str] = (),
        include: Sequence[str] = (),
    ) -> None:
        self.paths = [Path(p) for p in paths]
        self.settings = settings
        self.exclude = exclude
        self.include = include
        self.skipped: List[Tuple[Path, str]] = []
        self.write_errors: List[str] = []
        self._digests: Dict[str, str] = {}

    def read(self) -> Dict[str, bytes]:
        try:
            files, self.skipped = discover(self.paths, exclude=self.exclude, include=self.include)
        except DiscoveryError as exc:
            raise self.UsageError(str(exc)) from exc
        sources: Dict[str, bytes] = {}
        self.read_errors: List[FileResult] = []
        for path in files:
            key = str(path)
            try:
                data = path.read_bytes()
            except OSError as exc:
                self.read_errors.append(
                    FileResult(path=key, source=b"", error=f"{key}:1:1: cannot read: {exc.strerror or exc}")
                )
                continue
            sources[key] = data
            self._digests[key] = digest(data)
        return sources

    def convert(self) -> ConvertResult:
        sources = self.read()
        result = convert_sources(sources, self.settings)
        result.files.extend(self.read_errors)
        return result

    def write(self, result: ConvertResult) -> List[FileResult]:
        """Write every converted file atomically; returns those written."""
        written = []
        for file in result.changed:
            try:
                write_atomic(Path(file.path), file.output, expected_digest=self._digests.get(file.path))
            except ConcurrentModification as exc:
                self.write_errors.append(str(exc))
                continue
            except OSError as exc:
                self.write_errors.append(f"{file.path}: cannot write: {exc.strerror or exc}")
                continue
            written.append(file)
        return written
