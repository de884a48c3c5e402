"""Content-hash caches (like ruff's and black's): an unchanged file is not
analysed again.  One JSON file per configuration: lint's under
``.dp2ddp_cache/`` in the project (a ``.gitignore`` inside keeps it out of
git), convert's in the user's cache folder (``user_cache_dir``), one folder
per project, so that a diff or ``--check`` writes nothing in the tree; ``--no-cache`` or
``DP2DDP_NO_CACHE=1`` turns them off.  The key covers dp2ddp's version and
code (see ``code_fingerprint``) and everything in the configuration that
changes a result; the entry, the file's content.

``LintCache``: a file's findings.  ``ConvertCache``: the conversion of one file
of a program -- its output, findings or error -- keyed by everything that
conversion reads: the bytes, the path, the file's role in the program (which
depends on the other files), the run's settings; and each file's ``ast`` facts
(keyed by path and bytes), from which the roles are worked out.

Like git's index, an entry also keeps the file's size and modification time:
when both are unchanged and the file had not been modified in the two seconds
before it was hashed (so that a later edit must have moved its mtime), the file
is not even read.  Otherwise its content hash decides.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

from dp2ddp import __version__
from dp2ddp.codemods.rules import Diagnostic
from dp2ddp.files import SourceFiles

CACHE_DIR = ".dp2ddp_cache"
# a file modified this close to the time it was hashed may be modified again
# within the same mtime tick (coarse file systems tick in 2 s): its stat proves nothing
RACY_NS = 2_000_000_000


def disabled_by_environment() -> bool:
    """``DP2DDP_NO_CACHE`` set to anything but "" or "0" (like ``RUFF_NO_CACHE``)."""
    return os.environ.get("DP2DDP_NO_CACHE", "") not in ("", "0")


_FINGERPRINT: Optional[str] = None


def code_fingerprint() -> str:
    """dp2ddp's version and the size and modification time of each of its own
    source files: results of a checkout edited since (an editable install) are
    not reused.  A stat per file, no reading."""
    global _FINGERPRINT
    if _FINGERPRINT is None:
        import importlib.util

        folders = {Path(__file__).parent}
        spec = importlib.util.find_spec("dp2ddp.codemods")  # codemods/ in a checkout
        if spec is not None and spec.origin:
            folders.add(Path(spec.origin).parent)
        stats = []
        for folder in sorted(folders):
            for top, dirs, names in os.walk(folder):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                for name in sorted(names):
                    if name.endswith(".py"):
                        st = os.stat(os.path.join(top, name))
                        stats.append(f"{os.path.join(top, name)}:{st.st_size}:{st.st_mtime_ns}")
        material = "\n".join([__version__, *stats])
        _FINGERPRINT = hashlib.blake2b(material.encode(), digest_size=8).hexdigest()
    return _FINGERPRINT


def user_cache_dir() -> Path:
    """The user's cache folder for dp2ddp (``$XDG_CACHE_HOME/dp2ddp``, else
    ``~/.cache/dp2ddp``): where convert keeps its cache."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dp2ddp"


def for_project(root: Path) -> "ConvertCache":
    """convert's cache for the project at ``root``, in the user's cache folder
    (as black's), one folder per project: a diff or ``--check`` run writes
    nothing into the tree."""
    project = hashlib.sha256(os.path.abspath(root).encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return ConvertCache(root, directory=user_cache_dir() / "convert" / project)


def project_root(paths) -> Path:
    """Where a run on ``paths`` keeps its cache: the nearest folder above the
    first of them with a ``pyproject.toml`` or a ``.git`` (the project, as ruff
    finds it), else the current folder."""
    if paths:
        start = Path(paths[0]).absolute()
        folder = start if start.is_dir() else start.parent
        for candidate in (folder, *folder.parents):
            if (candidate / "pyproject.toml").is_file() or (candidate / ".git").exists():
                return candidate
    return Path.cwd()


def _load(path: Path) -> dict:
    """A cache file written by this version of dp2ddp; {} when there is none or
    it is not what ``save`` writes."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != __version__:
        return {}
    return data


def _part(data: dict, name: str) -> dict:
    """``data[name]`` if it is a table, else {}."""
    part = data.get(name)
    return part if isinstance(part, dict) else {}


def _table(data: dict, name: str) -> Dict[str, List[dict]]:
    """``data[name]`` as {path: [entry, ...]}, without what has another shape."""
    return {
        path: [e for e in kept if isinstance(e, dict)]
        for path, kept in _part(data, name).items()
        if isinstance(kept, list)
    }


def _save_json(directory: Path, path: Path, data: dict) -> None:
    """Write atomically; a cache that cannot be written is only a slower next run."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        ignore = directory / ".gitignore"
        if not ignore.exists():
            ignore.write_text("# created by dp2ddp\n*\n")
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(data, handle)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return
    _forget_stale(directory)


#: a cache file not written for this long belongs to an older dp2ddp or checkout
STALE_SECONDS = 30 * 24 * 3600


def _forget_stale(directory: Path) -> None:
    """Remove the cache files no run has written for ``STALE_SECONDS`` (those of
    other keys: earlier versions, edited checkouts, old configurations), so that
    the folder does not grow with every upgrade."""
    cutoff = time.time() - STALE_SECONDS
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                name = entry.name
                if (name.startswith(("lint-", "convert-")) and name.endswith(".json")) or name.endswith(".tmp"):
                    if entry.stat().st_mtime < cutoff:
                        os.unlink(entry.path)
    except OSError:
        pass


def _module_stat(path: str) -> Tuple[int, int]:
    try:
        stat = os.stat(path)
    except OSError:
        return (-1, -1)
    return (stat.st_size, stat.st_mtime_ns)


def _modules_unchanged(imported) -> bool:
    """Each (path, size, mtime_ns) still describes the file (a module an entry's
    findings were decided with)."""
    return all(tuple(_module_stat(p)) == (size, mtime) for p, size, mtime in imported)


class LintCache:
    def __init__(self, root: Path, config) -> None:
        key_material = json.dumps(
            {
                "version": __version__,
                "code": code_fingerprint(),
                "select": config.select,
                "extend_select": config.extend_select,
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
        # entries of another shape (a damaged or foreign file) are ignored
        self.entries: Dict[str, dict] = {
            path: entry
            for path, entry in _part(_load(self.path), "files").items()
            if isinstance(entry, dict)
            and isinstance(entry.get("digest"), str)
            and isinstance(entry.get("hashed_at", 0), (int, float))
            and isinstance(entry.get("diagnostics"), list)
            and all(isinstance(d, dict) for d in entry["diagnostics"])
        }
        self.dirty = False

    @staticmethod
    def _digest(data: bytes) -> str:
        return hashlib.blake2b(data, digest_size=16).hexdigest()

    def fresh(self, path: str, key) -> bool:
        """The file's (size, mtime_ns, ctime_ns, inode), taken before reading it, proves it unchanged."""
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
        if not _modules_unchanged(entry.get("imported", ())):
            return None  # a module it imports changed: its findings may (``setup_for_distributed``)
        try:
            return [Diagnostic(**{**d, "path": path}) for d in entry["diagnostics"]]
        except TypeError:  # written by other code (the fingerprint missed it): analyse again
            return None

    def put(
        self, path: str, sources: Mapping[str, bytes], diagnostics: List[Diagnostic], imported: Tuple[str, ...] = ()
    ) -> None:
        """``imported``: the module files the findings were decided with (read
        for the file's imports): the entry holds while none of them changes."""
        key = sources.stat(path) if isinstance(sources, SourceFiles) else None
        self.entries[os.path.abspath(path)] = {
            "digest": self._digest(sources[path]),
            "stat": list(key) if key is not None else None,
            "hashed_at": time.time_ns(),
            "diagnostics": [{k: v for k, v in d.to_dict().items() if k != "path"} for d in diagnostics],
            "imported": [[p, *_module_stat(p)] for p in imported],
        }
        self.dirty = True

    def save(self) -> None:
        if self.dirty:
            _save_json(self.directory, self.path, {"version": __version__, "files": self.entries})


class ConvertCache:
    """The conversions of single files (``engine._convert_one``: a pure function of
    its job), so that ``convert --write`` after a look at the diff, or a
    ``convert --check`` in CI on an unchanged repository, does not convert again.

    Errors that are bugs in dp2ddp (internal) are never stored.  A path keeps its
    few latest entries (the file as given and, after ``--write``, its converted
    text, which the fixed-point check converts again)."""

    PER_PATH = 4

    def __init__(self, root: Path, directory: Optional[Path] = None) -> None:
        """The cache of the project at ``root``, kept in ``directory`` (default:
        ``root/.dp2ddp_cache``; the command line's is ``for_project``'s)."""
        from importlib import metadata

        def version(dist: str) -> str:
            try:
                return metadata.version(dist)
            except metadata.PackageNotFoundError:
                return ""

        # what the conversion runs: dp2ddp's code, LibCST's parser and printer,
        # black for the long lines it reformats (its version read, not imported)
        # and the Python that runs them (one checkout, several environments)
        key_material = json.dumps(
            [
                __version__,
                code_fingerprint(),
                version("libcst"),
                version("black"),
                sys.implementation.name,
                list(sys.version_info[:2]),
            ]
        )
        key = hashlib.sha256(key_material.encode()).hexdigest()[:16]
        self.directory = Path(directory) if directory is not None else Path(root) / CACHE_DIR
        self.path = self.directory / f"convert-{key}.json"
        data = _load(self.path)
        #: {absolute path: its latest entries, each with its "key"}, for the
        #: conversions and for the ``ast`` facts
        self.entries: Dict[str, List[dict]] = _table(data, "files")
        self.facts: Dict[str, List[dict]] = _table(data, "facts")
        self.dirty = False

    @staticmethod
    def _key(spec: str, data: bytes) -> str:
        h = hashlib.blake2b(spec.encode("utf-8", "surrogateescape"), digest_size=16)
        h.update(b"\0")
        h.update(data)
        return h.hexdigest()

    @classmethod
    def job_key(cls, job) -> str:
        import dataclasses

        path, data, role, settings, skip = job
        spec = json.dumps(
            [path, dataclasses.asdict(role), dataclasses.asdict(settings), sorted(skip)], sort_keys=True
        )
        return cls._key(spec, data)

    @staticmethod
    def _find(table: Dict[str, List[dict]], path: str, key: str) -> Optional[dict]:
        return next((e for e in table.get(os.path.abspath(path), ()) if e.get("key") == key), None)

    def _remember(self, table: Dict[str, List[dict]], path: str, entry: dict) -> None:
        """Keep ``entry`` first among the path's ``PER_PATH`` latest."""
        name = os.path.abspath(path)
        kept = [e for e in table.get(name, ()) if e.get("key") != entry["key"]]
        table[name] = [entry, *kept][: self.PER_PATH]
        self.dirty = True

    # ---------------------------------------------------------------- conversions
    def get(self, job) -> Optional[Tuple]:
        """``_convert_one``'s result for ``job`` if it was stored, else None."""
        from dp2ddp.codemods._model import Finding

        entry = self._find(self.entries, job[0], self.job_key(job))
        if entry is None:
            return None
        try:
            output = entry["output"]
            if entry.get("same"):
                output = job[1]
            elif output is not None:
                output = output.encode("utf-8", "surrogateescape")
            findings = [Finding(**{**f, "path": job[0]}) for f in entry["findings"]]
            error = entry["error"]
            if not (error is None or isinstance(error, str)):
                return None
            return job[0], output, findings, error, False
        except (KeyError, TypeError, AttributeError, UnicodeError):
            return None  # an entry in another shape: convert again

    def put(self, job, result: Tuple) -> None:
        path, output, findings, error, internal = result
        if internal:
            return
        same = output is not None and output == job[1]
        entry = {
            "key": self.job_key(job),
            # surrogateescape: any bytes (a latin-1 file) survive JSON unchanged
            "output": output.decode("utf-8", "surrogateescape") if output is not None and not same else None,
            "same": same,  # nothing to change: the file's own bytes
            "findings": [{k: v for k, v in f.to_dict().items() if k != "path"} for f in findings],
            "error": error,
        }
        self._remember(self.entries, path, entry)

    # ---------------------------------------------------------------- ast facts
    # what the engine learns about each file before it can decide the program's
    # roles (every file that mentions torch is parsed for them, each run)
    def get_facts(self, item: Tuple[str, bytes]) -> Optional[Tuple]:
        """(path, FileFacts or None, error or None) stored for (path, bytes), else None."""
        from dp2ddp.codemods._facts import FileFacts
        from dp2ddp.codemods._model import ModelAttributeFunction

        path, data = item
        entry = self._find(self.facts, path, self._key(path, data))
        if entry is None:
            return None
        try:
            stored, error = entry["facts"], entry["error"]
            if stored is None:
                return (path, None, error) if isinstance(error, str) else None
            facts = FileFacts(**stored)
            facts.imports = set(facts.imports)
            facts.relative_imports = {tuple(i) for i in facts.relative_imports}
            facts.path_roots = set(facts.path_roots)
            facts.in_batch_label_batches = set(facts.in_batch_label_batches)
            facts.state_dict_savers = {
                name: (tuple(params), tuple(saved)) for name, (params, saved) in facts.state_dict_savers.items()
            }
            facts.model_attribute_functions = {
                name: ModelAttributeFunction(
                    tuple(f["params"]), tuple(tuple(a) for a in f["attributes"]), f["trains"]
                )
                for name, f in facts.model_attribute_functions.items()
            }
            facts.loader_batch_names = set(facts.loader_batch_names)
            facts.writing_functions = set(facts.writing_functions)
            facts.optimizer_methods = set(facts.optimizer_methods)
            facts.local_data_parallel = [tuple(i) for i in facts.local_data_parallel]
            facts.torch_through_star = [tuple(i) for i in facts.torch_through_star]
            return path, facts, None
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    def put_facts(self, item: Tuple[str, bytes], result: Tuple) -> None:
        import dataclasses

        path, data = item
        _, facts, error = result
        stored = None
        if facts is not None:
            stored = dataclasses.asdict(facts)
            stored["imports"] = sorted(stored["imports"])
            stored["relative_imports"] = sorted(stored["relative_imports"])
            stored["path_roots"] = sorted(stored["path_roots"])
            stored["in_batch_label_batches"] = sorted(stored["in_batch_label_batches"])
            stored["loader_batch_names"] = sorted(stored["loader_batch_names"])
            stored["writing_functions"] = sorted(stored["writing_functions"])
            stored["optimizer_methods"] = sorted(stored["optimizer_methods"])
        self._remember(self.facts, path, {"key": self._key(path, data), "facts": stored, "error": error})

    def save(self) -> None:
        if self.dirty:
            # files deleted since they were converted are forgotten
            entries = {path: kept for path, kept in self.entries.items() if os.path.exists(path)}
            facts = {path: kept for path, kept in self.facts.items() if os.path.exists(path)}
            _save_json(
                self.directory, self.path, {"version": __version__, "files": entries, "facts": facts}
            )
