"""A convert run on the file system: discover, read, convert, write.

Separated from the CLI so that tests and other tools (``lint --fix``,
``convert --verify``) drive the same code path.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from dp2ddp.files import (
    DiscoveryError,
    SourceFiles,
    WriteRefused,
    digest,
    discover,
    is_notebook,
    stale_temporary_files,
    stat_key,
    write_atomic,
)

# The engine (LibCST) is imported only by what converts: `dp2ddp lint` must start fast.


def _git_toplevel(folder: Path):
    import subprocess

    try:
        proc = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "--show-toplevel"], capture_output=True, text=True
        )
    except OSError:
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _write(path: str, data: bytes, expected_digest, errors: List[str]) -> bool:
    """``write_atomic``; a refusal (edited since it was read, read-only) or an
    OS error goes into ``errors``, naming the file.  True when written."""
    try:
        write_atomic(Path(path), data, expected_digest=expected_digest)
    except WriteRefused as exc:
        errors.append(str(exc))
        return False
    except OSError as exc:
        errors.append(f"{path}: cannot write: {exc.strerror or exc}")
        return False
    return True


def remove_stale_temporary_files(files: Sequence[Path], errors: List[str]) -> List[Path]:
    """Remove what an interrupted write left beside ``files`` (see
    ``stale_temporary_files``); returns those removed, errors into ``errors``."""
    removed = []
    for path in stale_temporary_files(files):
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            errors.append(f"{path}: cannot remove this temporary file of an interrupted write: {exc.strerror or exc}")
            continue
        removed.append(path)
    return removed


def explicit_files(paths: Sequence[Path]) -> set:
    """The files named on the command line (not found by walking a folder)."""
    return {str(p) for p in paths if Path(p).is_file()}


#: why convert leaves a notebook as it is, and what to do
NOTEBOOK_WHY = (
    "a Jupyter notebook (convert rewrites .py files only: export it with `jupyter nbconvert --to "
    "script` and convert that; `dp2ddp lint` checks its code cells)"
)
NOTEBOOK_NOT_CONVERTED = f"cannot convert {NOTEBOOK_WHY}"


class ConvertRun:
    class UsageError(Exception):
        """Bad paths or options (exit code 2)."""

    def __init__(
        self,
        paths: Sequence[Path],
        settings=None,
        exclude: Sequence[str] = (),
        include: Sequence[str] = (),
        workers: int = 1,
        verify: bool = True,
        cache=None,
        clean_temporary: bool = False,
    ) -> None:
        from dp2ddp.codemods._model import Settings

        #: remove the temporary files an interrupted write left beside the files (a run that writes)
        self.clean_temporary = clean_temporary
        self.removed_temporary: List[Path] = []
        #: a ``ConvertCache`` (None: convert every file)
        self.cache = cache
        self.workers = workers
        self.verify = verify
        self.paths = [Path(p) for p in paths]
        self.settings = settings if settings is not None else Settings()
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
        named = {os.path.normcase(os.path.abspath(p)) for p in self.paths}
        for notebook in [f for f in files if is_notebook(f)]:
            # a notebook named on the command line is work left undone (an error);
            # one found in a folder, a warning that names it
            explicit = os.path.normcase(os.path.abspath(notebook)) in named
            self.skipped.append((notebook, NOTEBOOK_NOT_CONVERTED if explicit else f"not converted: {NOTEBOOK_WHY}"))
        files = [f for f in files if not is_notebook(f)]
        if self.clean_temporary:
            self.removed_temporary = remove_stale_temporary_files(files, self.write_errors)
        from dp2ddp.engine import FileResult

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

    def convert(self, progress=None):
        """Read, then convert; ``progress(phase, done, total)`` as in ``convert_sources``."""
        from dp2ddp.engine import convert_sources

        sources = self.read()
        left_out = self._modules_left_out(sources)
        result = convert_sources(
            sources,
            self.settings,
            verify=self.verify,
            explicit=explicit_files(self.paths),
            workers=self.workers,
            cache=self.cache,
            context=left_out,
            progress=progress,
        )
        if self.cache is not None:
            self.cache.save()
        self._note_modules_left_out(result, left_out)
        result.files.extend(self.read_errors)
        return result

    def _modules_left_out(self, sources: Dict[str, bytes]) -> Dict[str, bytes]:
        """The modules of their project that the given files import but that were
        not given (``dp2ddp convert train.py`` beside ``generate.py``), and that use
        torch: {path: bytes}.  Read for what they do (never converted or written)."""
        given = {os.path.normpath(os.path.abspath(p)) for p in sources}
        found: Dict[str, bytes] = {}
        for path, data in sources.items():
            for candidate in _imported_module_files(path, data):
                key = candidate if os.path.isabs(path) else os.path.relpath(candidate)
                if candidate in given or key in found or not os.path.isfile(candidate):
                    continue
                try:
                    with open(candidate, "rb") as handle:
                        text = handle.read()
                except OSError:
                    continue
                if b"torch" in text:
                    found[key] = text  # (spelled like the given paths: the import graph joins them)
        return found

    def _note_modules_left_out(self, result, left_out: Dict[str, bytes]) -> None:
        """An entry point imports modules of its project that were not given (``dp2ddp
        convert train.py`` beside ``trainer.py``): they are not converted -- their
        loops, loaders and saves stay single-process -- so the report says which."""
        from dp2ddp.codemods._model import Finding

        left_out_paths = {os.path.abspath(p) for p in left_out}
        for entry in result.entries:
            if entry.output is None and not entry.findings:
                continue
            missing = {
                os.path.relpath(candidate)
                for candidate in _imported_module_files(entry.path, entry.source)
                if candidate in left_out_paths
            }
            wrapping = sorted(
                os.path.relpath(p) for p, data in left_out.items()
                if os.path.relpath(p) in missing and b"DataParallel(" in data
            )
            if wrapping:
                # (the model is wrapped there: DDP here would nest over it, none leaves it undistributed)
                entry.findings.append(
                    Finding(
                        "DDP001", "manual", 1, 1,
                        f"{', '.join(wrapping)}, which this entry point imports, wraps the model in DataParallel "
                        "and was not given: it stays DataParallel and every rank trains its own copy; convert it "
                        "too (name it, or convert the project's folder)",
                        "process-group-setup", entry.path,
                    )
                )
            if missing:
                entry.findings.append(
                    Finding(
                        "DDP002", "note", 1, 1,
                        f"this entry point imports {', '.join(sorted(missing))}, which were not given: "
                        "they are not converted (their loops, loaders and saves stay single-process); "
                        "convert the project's folder instead",
                        "process-group-setup", entry.path,
                    )
                )

    def dirty_files(self, result) -> List[str]:
        """Files it would modify that have uncommitted changes in their git work tree
        (modified, staged or untracked); empty outside git."""
        import subprocess

        dirty: List[str] = []
        by_root: Dict[str, List[Path]] = {}
        for file in result.changed:
            path = Path(file.path).resolve()
            root = _git_toplevel(path.parent)
            if root is not None:
                by_root.setdefault(root, []).append(path)
        for root, paths in by_root.items():
            try:
                out = subprocess.run(
                    ["git", "-C", root, "status", "--porcelain", "-z", "--", *map(str, paths)],
                    capture_output=True,
                    check=True,
                ).stdout.decode("utf-8", "replace")
            except (OSError, subprocess.CalledProcessError):
                continue
            for entry in out.split("\0"):
                if len(entry) > 3:
                    dirty.append(str(Path(root, entry[3:])))
        return dirty

    def write_outputs(self, outputs: Dict[str, bytes]) -> List[str]:
        """Write {path: bytes} atomically (the --interactive selection)."""
        return [
            path
            for path, data in outputs.items()
            if _write(path, data, self._digests.get(path), self.write_errors)
        ]

    def write(self, result) -> list:
        """Write every converted file atomically; returns those written."""
        return [
            file
            for file in result.changed
            if _write(file.path, file.output, self._digests.get(file.path), self.write_errors)
        ]


class LintRun:
    """A lint run on the file system: discover, read, lint, fix."""

    def __init__(
        self, paths: Sequence[Path], config, extra_exclude: Sequence[str] = (), clean_temporary: bool = False
    ) -> None:
        #: as ``ConvertRun.clean_temporary`` (``--fix``)
        self.clean_temporary = clean_temporary
        self.removed_temporary: List[Path] = []
        self.paths = [Path(p) for p in paths]
        self.config = config
        self.extra_exclude = extra_exclude
        self.write_errors: List[str] = []
        self.internal_errors: List[str] = []
        self.skipped: List[Tuple[Path, str]] = []

    def read(self, cache=None) -> SourceFiles:
        """The files to lint, each stat-ed now and read when it is linted (so that
        a run holds one file at a time, not the tree).  A file the ``cache``
        vouches for by its stat is not read at all (unless a fix needs it)."""
        try:
            files, self.skipped = discover(self.paths, exclude=self.extra_exclude)
        except DiscoveryError as exc:
            raise ConvertRun.UsageError(str(exc)) from exc
        if self.clean_temporary:
            self.removed_temporary = remove_stale_temporary_files(files, self.write_errors)
        spec = None
        if self.config.exclude:
            import pathspec

            spec = pathspec.GitIgnoreSpec.from_lines(self.config.exclude)
        sources = SourceFiles()
        named = explicit_files(self.paths) if spec is not None or self.extra_exclude else set()
        cli_spec = None
        if self.extra_exclude:
            import pathspec

            cli_spec = pathspec.GitIgnoreSpec.from_lines(self.extra_exclude)
        for path in files:
            if cli_spec is not None and str(path) in named and cli_spec.match_file(
                os.path.relpath(path).replace(os.sep, "/")
            ):
                # a named file too (pre-commit names every file), like `exclude` in the config
                self.skipped.append((path, "excluded by --exclude"))
                continue
            if spec is not None and self.config.root is not None:
                try:
                    rel = path.absolute().relative_to(self.config.root.resolve()).as_posix()
                except ValueError:
                    rel = None
                if rel is not None and spec.match_file(rel):
                    if str(path) in named:  # (pre-commit names every file: excluded all the same)
                        self.skipped.append((path, f"excluded by `exclude` in {self.config.source}"))
                    continue
            name = str(path)
            try:
                key = stat_key(os.stat(name))  # before reading: see LintCache
            except OSError as exc:
                self.write_errors.append(f"{path}: cannot read: {exc.strerror or exc}")
                continue
            sources.add(name, None, key)
        return sources

    def fix(self, sources: Dict[str, bytes], diagnostics, unsafe: bool) -> List[str]:
        """Apply the fixes and write the files; returns the paths written."""
        from dp2ddp.lint import fix_sources

        written = []
        for path, file in fix_sources(sources, diagnostics, unsafe, explicit_files(self.paths)).items():
            if file.error is not None:
                (self.internal_errors if file.internal else self.write_errors).append(file.error)
                continue
            if not file.changed:
                continue
            # the bytes the fix was made from: a file edited since is not overwritten
            if not _write(path, file.output, digest(file.source), self.write_errors):
                continue
            sources[path] = file.output
            written.append(path)
        return written


def _imported_module_files(path: str, data: bytes) -> List[str]:
    """The files (absolute paths, existing or not) that the imports of the file at
    ``path`` may name: ``import data`` beside it, relative imports from its package."""
    if b"import" not in data:
        return []
    from dp2ddp.codemods._program import imported_module_files

    return imported_module_files(path, data.decode("utf-8", "replace"))
