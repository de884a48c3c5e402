"""Which files a run looks at, and how they are read and written.

Discovery (like black and ruff): a file given by name is always taken; a folder
is walked recursively, skipping hidden folders, virtual environments, build
outputs, ``site-packages`` and whatever the ``.gitignore`` files of the
repository ignore.  Symbolic links are never followed out of the folder given.

Writes are atomic: a temporary file in the same folder, flushed and renamed over
the original, with the original's permission bits.  The bytes come from LibCST,
which keeps the file's encoding (coding cookie, BOM) and line endings.
"""

from __future__ import annotations

import hashlib
import fnmatch
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple

SKIP_DIRS = frozenset(
    {
        "__pycache__",
        "build",
        "dist",
        "site-packages",
        "node_modules",
        "venv",
        "env",
        "__pypackages__",
        "_build",
        "buck-out",
    }
)


#: Jupyter notebooks: lint checks their code cells; convert names them, unconverted
NOTEBOOK_SUFFIX = ".ipynb"


def is_notebook(path) -> bool:
    return str(path).endswith(NOTEBOOK_SUFFIX)


def skip_is_error(why: str) -> bool:
    """A skipped path that leaves part of the run unchecked (a folder that could not
    be listed: "cannot ..."), as opposed to one skipped on purpose (a warning)."""
    return why.startswith("cannot")


class DiscoveryError(Exception):
    """A path given on the command line that does not exist."""


def _gitignore_spec(directory):
    ignore = os.path.join(directory, ".gitignore")
    if not os.path.isfile(ignore):
        return None
    import pathspec

    try:
        with open(ignore, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    return pathspec.GitIgnoreSpec.from_lines(lines)


def _git_root(path: Path) -> Optional[Path]:
    for parent in [path, *path.parents]:
        if (parent / ".git").exists():
            return parent
    return None


class _Ignores:
    """The .gitignore files that apply below a directory (nearest last)."""

    def __init__(self, specs: Sequence[Tuple[Path, object]] = ()) -> None:
        self.specs = list(specs)

    @classmethod
    def for_directory(cls, directory: Path) -> "_Ignores":
        root = _git_root(directory)
        chain: List[Path] = []
        if root is not None:
            current = directory
            while True:
                chain.append(current)
                if current == root or current.parent == current:
                    break
                current = current.parent
            chain.reverse()
        else:
            chain = [directory]
        specs = [(d, s) for d in chain if (s := _gitignore_spec(d)) is not None]
        # a folder given on the command line is walked even when a .gitignore
        # above it ignores it (asked for by name, like a file): such a file's
        # patterns then apply below the folder only (`*.pyc` still does, `vendor/`
        # no longer hides the folder itself)
        rebased = [
            (directory if cls([(d, spec)])._ignored_or_parent(directory) else d, spec) for d, spec in specs
        ]
        return cls(rebased)

    def _ignored_or_parent(self, path: Path) -> bool:
        current = path
        base = self.specs[0][0]
        while True:
            if self.ignored(current, is_dir=True):
                return True
            if current == base or current.parent == current:
                return False
            current = current.parent

    def descend(self, directory) -> "_Ignores":
        spec = _gitignore_spec(directory)
        return _Ignores(self.specs + [(Path(directory), spec)]) if spec is not None else self

    def ignored(self, path, is_dir: bool) -> bool:
        """``path``: an absolute, resolved path (str or Path).  As git does, the
        deepest ``.gitignore`` with a matching pattern decides (``!*.py`` below
        un-ignores what ``*.py`` above ignored)."""
        path = str(path)
        verdict = False
        for base, spec in self.specs:
            base = str(base)
            if path == base:
                rel = "."
            elif path.startswith(base.rstrip(os.sep) + os.sep):
                rel = path[len(base.rstrip(os.sep)) + 1 :]
                if os.sep != "/":
                    rel = rel.replace(os.sep, "/")
            else:
                continue
            if is_dir:
                rel += "/"
            decision = spec.check_file(rel).include  # type: ignore[attr-defined]
            if decision is not None:
                verdict = decision  # the nearest .gitignore that says something decides
        return verdict


def _is_venv(entries: Sequence[os.DirEntry]) -> bool:
    """A folder listing with a virtual environment's marker (from the listing
    itself: no stat per folder)."""
    for entry in entries:
        if entry.name == "pyvenv.cfg" and entry.is_file() or entry.name == "conda-meta" and entry.is_dir():
            return True
    return False


class _Patterns(NamedTuple):
    """The command line's ``--exclude``/``--include`` patterns, compiled; the
    include patterns as given too (they may name a folder skipped by default)."""

    exclude: Optional[object]
    include: Optional[object]
    include_patterns: Tuple[str, ...]


def discover(
    paths: Iterable[Path],
    exclude: Sequence[str] = (),
    include: Sequence[str] = (),
) -> Tuple[List[Path], List[Tuple[Path, str]]]:
    """Python files (and Jupyter notebooks) under ``paths``; also (path, why) for
    paths that were skipped."""
    found: List[Path] = []
    skipped: List[Tuple[Path, str]] = []
    seen = set()
    extra = None
    if exclude or include:
        import pathspec

        extra_exclude = pathspec.GitIgnoreSpec.from_lines(exclude) if exclude else None
        extra_include = pathspec.GitIgnoreSpec.from_lines(include) if include else None
        extra = _Patterns(extra_exclude, extra_include, tuple(include))

    def add(path: Path, resolved: Optional[str] = None) -> None:
        # one file named two ways (a symlink to it, ``a/../a/x.py``) is one file;
        # the walk knows each file's resolved path already (one realpath per folder)
        key = os.path.normcase(resolved if resolved is not None else os.path.realpath(path))
        if key not in seen:
            seen.add(key)
            found.append(path)

    for given in paths:
        if given.is_symlink():
            problem = _named_link_problem(given)
            if problem is not None:
                if problem.startswith("a symbolic link to"):  # (a link out of the tree)
                    skipped.append((given, problem))
                    continue
                raise DiscoveryError(f"{given}: {problem}")
        elif not given.exists():
            raise DiscoveryError(f"{given}: no such file or directory")
        if given.is_file():
            add(given)
            continue
        if not given.is_dir():
            skipped.append((given, "not a regular file or directory"))
            continue
        root = given.resolve()
        for path, resolved in _walk(str(given), root, _Ignores.for_directory(root), extra, skipped):
            add(path, resolved)
    return found, skipped


def _walk(directory: str, root: Path, ignores: _Ignores, extra, skipped, resolved: Optional[str] = None) -> Iterator[Tuple[Path, str]]:
    # plain strings and os.scandir (whose entries know their type): pathlib and a
    # stat per folder cost more than the walk itself on thousands of files
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError as exc:
        skipped.append((Path(directory), f"cannot list: {exc.strerror}"))
        return
    below = resolved is not None  # a folder found by the walk, not one given
    if below and _is_venv(entries):
        return
    resolved = resolved if resolved is not None else os.path.realpath(directory)  # once per folder
    if resolved != str(root) and any(e.name == ".gitignore" for e in entries):
        ignores = ignores.descend(resolved)
    for entry in entries:
        name = entry.name
        resolved_here = os.path.join(resolved, name)
        if entry.is_symlink():
            path = Path(entry.path)
            try:
                target = path.resolve(strict=True)
            except (OSError, RuntimeError) as exc:  # a loop, a dangling link
                skipped.append((path, f"symbolic link that cannot be resolved ({exc.__class__.__name__}), not followed"))
                continue
            if not _inside(target, root):
                skipped.append((path, "symbolic link out of the tree, not followed"))
                continue
            continue  # a link inside the tree: its target is reached through the tree itself
        if entry.is_dir(follow_symlinks=False):
            skipped_by_default = (
                name.startswith(".") or name in SKIP_DIRS or ignores.ignored(resolved_here, is_dir=True)
            )
            if skipped_by_default and not _named_by_include(extra, resolved_here, root):
                continue
            if _extra_excluded(extra, resolved_here, root, True):
                continue
            yield from _walk(entry.path, root, ignores, extra, skipped, resolved_here)
        elif name.endswith((".py", NOTEBOOK_SUFFIX)):
            if ignores.ignored(resolved_here, is_dir=False) and not _named_by_include(extra, resolved_here, root, True):
                continue
            if _extra_excluded(extra, resolved_here, root, False):
                continue
            if not entry.is_file(follow_symlinks=False):
                skipped.append((Path(entry.path), "not a regular file (a FIFO, a device?), not read"))
                continue
            yield Path(entry.path), resolved_here


def _named_by_include(extra, path: str, root: Path, is_file: bool = False) -> bool:
    """A folder (or a file) skipped by default -- hidden, ``build/``, gitignored --
    that an ``--include`` pattern names, or names something in (``build/*``,
    ``.hidden/train.py``): it is taken after all."""
    if extra is None or not extra.include_patterns:
        return False
    try:
        parts = Path(path).relative_to(root).parts
    except ValueError:
        return False
    for pattern in extra.include_patterns:
        steps = pattern.strip().lstrip("/").split("/")
        longer = len(steps) == len(parts) if is_file else len(steps) > len(parts)
        folders = parts[:-1] if is_file else parts
        # the skipped folders spelled out: ``*/train.py`` or ``**/x.py`` names none of them
        if longer and all(p == s for p, s in zip(folders, steps)) and (
            not is_file or fnmatch.fnmatchcase(parts[-1], steps[len(parts) - 1])
        ):
            return True
    return False


def _extra_excluded(extra, path: Path, root: Path, is_dir: bool) -> bool:
    if extra is None:
        return False
    exclude, include = extra.exclude, extra.include
    try:
        rel = Path(path).relative_to(root).as_posix()
    except ValueError:
        rel = Path(path).as_posix()
    if is_dir:
        rel += "/"
    if exclude is not None and exclude.match_file(rel):
        return True
    if include is not None and not is_dir and not include.match_file(rel):
        return True
    return False


def _tree_of(path: Path) -> Path:
    """The tree a path named on the command line belongs to: its git work tree,
    else the current folder when it lies there, else its own folder."""
    folder = Path(os.path.abspath(path)).parent
    root = _git_root(folder)
    if root is not None:
        return Path(os.path.realpath(root))
    cwd = Path(os.path.realpath(os.getcwd()))
    real_folder = Path(os.path.realpath(folder))
    return cwd if _inside(real_folder, cwd) else real_folder


def _named_link_problem(link: Path) -> Optional[str]:
    """Why a symbolic link named on the command line is not taken (None: it is):
    it dangles or loops (an error, as a missing path), or it leads out of its
    tree (skipped: converting it would rewrite a file elsewhere)."""
    try:
        target = Path(os.path.realpath(link, strict=True))
    except FileNotFoundError:
        return f"no such file or directory (a symbolic link to {os.readlink(link)}, which does not exist)"
    except (OSError, RuntimeError):
        return "a symbolic link that loops (it never reaches a file)"
    tree = _tree_of(link)
    if target.is_file() and not _inside(target, tree):
        return (
            f"a symbolic link to {target}, outside {tree}: not taken (converting it would rewrite "
            "that file); name the file itself to check or convert it"
        )
    return None


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False


# ---------------------------------------------------------------- reading/writing
StatKey = Tuple[int, int, int, int]  # (size, mtime_ns, ctime_ns, inode)


def stat_key(st: os.stat_result) -> StatKey:
    """As git's index: besides size and mtime, the ctime (which a write moves even
    when the mtime is set back, ``touch -r``) and the inode (a file replaced)."""
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


class SourceFiles(Mapping[str, bytes]):
    """{path: bytes} of the files a run looks at, with each file's stat taken
    *before* it was read.  A file may be left unread (the lint cache vouched for
    it by its stat): it is read the first time its bytes are asked for."""

    def __init__(self) -> None:
        self._data: Dict[str, Optional[bytes]] = {}
        self._stats: Dict[str, StatKey] = {}

    def add(self, path: str, data: Optional[bytes], key: Optional[StatKey] = None) -> None:
        self._data[path] = data
        if key is not None:
            self._stats[path] = key

    def stat(self, path: str) -> Optional[StatKey]:
        return self._stats.get(path)

    def is_read(self, path: str) -> bool:
        return self._data[path] is not None

    def discard(self, path: str) -> None:
        """Take out a file that turned out unreadable (it was reported)."""
        self._data.pop(path, None)
        self._stats.pop(path, None)

    def release(self, path: str) -> None:
        """Forget the bytes of a file that is done with (read again if asked for):
        a run's memory then follows its largest file, not the size of the tree."""
        self._data[path] = None

    def __getitem__(self, path: str) -> bytes:
        data = self._data[path]
        if data is None:
            data = self._data[path] = Path(path).read_bytes()
        return data

    def __setitem__(self, path: str, data: bytes) -> None:
        self._data[path] = data
        self._stats.pop(path, None)  # what is on disk now was not stat-ed before reading

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class WriteRefused(Exception):
    """A file that is not rewritten, for the reason in the message."""


class ConcurrentModification(WriteRefused):
    """The file changed on disk between reading and writing."""


class ReadOnlyFile(WriteRefused):
    """The file has no write permission (a vendored copy, a Perforce checkout
    not opened for edit): replacing it by rename would ignore that."""


def write_atomic(path: Path, data: bytes, expected_digest: Optional[str] = None) -> None:
    """Replace ``path`` with ``data`` atomically, keeping its permission bits.

    When ``expected_digest`` is given and the file on disk no longer has it, the
    file is not replaced (someone edited it since it was read).  A file without
    write permission is not replaced either (a rename needs only the folder's,
    and would make a read-only file silently writable-by-replacement); for root,
    whom ``access`` lets write anything, that is a file with no write bit at all.
    """
    path = Path(path)
    target = path.resolve()
    st = target.stat()
    if not st.st_mode & 0o222 or not os.access(target, os.W_OK):
        raise ReadOnlyFile(f"{path}: read-only file, not rewritten (make it writable to convert it)")
    # (the writer's pid in the name: a later run removes the file once that
    # process is gone -- killed between this and the rename)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.{os.getpid()}-", suffix=TEMPORARY_SUFFIX, dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, stat.S_IMODE(st.st_mode))
        try:
            os.chown(tmp, st.st_uid, st.st_gid)
        except (PermissionError, AttributeError, OSError):
            pass
        if expected_digest is not None:
            current = target.read_bytes()
            if digest(current) != expected_digest:
                raise ConcurrentModification(f"{path}: changed on disk since it was read; re-run")
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


TEMPORARY_SUFFIX = ".dp2ddp.tmp"
#: ``write_atomic``'s temporary file for ``name``: ``.<name>.<pid>-<random>.dp2ddp.tmp``
#: (before the pid was in the name: ``.<name>.<random>.dp2ddp.tmp``)
_TEMPORARY = re.compile(r"\.(?P<name>.+)\.(?:(?P<pid>[0-9]+)-)?[a-z0-9_]{8}\.dp2ddp\.tmp\Z")
#: a temporary file without a pid older than this is left over, not being written
_OLD_TEMPORARY_SECONDS = 60.0


def _writer_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # (another user's process)
        return True
    return True


def stale_temporary_files(files: Iterable[Path]) -> List[Path]:
    """The temporary files that an interrupted ``write_atomic`` (a SIGKILL
    between writing and renaming) left beside ``files``: named for one of them,
    and whose writer is gone (or, without a pid in the name, old)."""
    import time

    by_folder: Dict[str, set] = {}
    for path in files:
        by_folder.setdefault(os.path.dirname(str(path)) or ".", set()).add(os.path.basename(str(path)))
    stale: List[Path] = []
    now = time.time()
    for folder, names in by_folder.items():
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            match = _TEMPORARY.match(entry.name) if entry.name.endswith(TEMPORARY_SUFFIX) else None
            if match is None or match["name"] not in names:
                continue
            try:
                if not entry.is_file(follow_symlinks=False):
                    continue
                if match["pid"] is not None:
                    if _writer_alive(int(match["pid"])):
                        continue
                elif now - entry.stat(follow_symlinks=False).st_mtime < _OLD_TEMPORARY_SECONDS:
                    continue
            except OSError:
                continue
            stale.append(Path(folder, entry.name))
    return sorted(stale)
