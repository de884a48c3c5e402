"""What the modules a file imports tell about the program it belongs to.

Some facts that decide a finding live in another file: DETR's and DeiT's
``util/misc.py`` replaces ``builtins.print`` with a rank-aware one
(``setup_for_distributed(is_master)``), and every ``print`` of ``engine.py``
then shows on the main process only; detectron2-style ``setup_logger`` adds
the log handlers on rank 0 only.  ``imported_facts(src)`` resolves the
file's imports on disk (beside the file, in its ancestors' folders, relative
imports from its package), reads those module files (never writes) and
gathers their facts; ``src.cache["imported_files"]`` keeps which files were
read, so that a cache of the finding can tell when one of them changed.

The same lookups of ``import x.y`` serve convert's program graph
(``module_files``, ``package_folder``).
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from . import _names as N
from ._analysis import (
    Source, called_name, called_only_on_main, calls_of_name, dotted, environ_key, is_rank_dependent, last_name,
    on_main_process_only,
)

#: how many folders above the file an absolute import is looked for (a script in
#: ``tools/`` run from the repository root imports the root's packages)
ANCESTOR_LEVELS = 3


def module_files(folder: str, dotted_name: str) -> Tuple[str, ...]:
    """The files (normalised paths) that ``import dotted_name`` finds below
    ``folder``: ``a/b.py`` or the package ``a/b/__init__.py``."""
    parts = [p for p in dotted_name.split(".") if p]
    if not parts:
        return ()
    return (
        os.path.normpath(os.path.join(folder, *parts) + ".py"),
        os.path.normpath(os.path.join(folder, *parts, "__init__.py")),
    )


def package_folder(folder: str, level: int) -> str:
    """Where ``from ..x import y`` (``level`` dots) looks, from a file in ``folder``."""
    for _ in range(level - 1):
        folder = os.path.dirname(folder)
    return folder


def imported_module_files(path: str, text: str, ancestors: int = 0) -> List[str]:
    """The files (absolute paths, existing or not) that the imports of the file at
    ``path`` may name: ``import data`` beside it (and in up to ``ancestors``
    folders above it), relative imports from its package."""
    if "import" not in text:
        return []
    from ._facts import import_facts

    facts = import_facts(text)
    folder = os.path.dirname(os.path.abspath(path))
    wanted = [(base, name) for base in _folder_and_above(folder, ancestors) for name in sorted(facts.imports)]
    wanted += [(package_folder(folder, level), name) for level, name in sorted(facts.relative_imports)]
    return [candidate for base, name in wanted for candidate in module_files(base, name)]


def _folder_and_above(folder: str, levels: int) -> List[str]:
    """``folder`` and up to ``levels`` folders above it, nearest first."""
    bases = [folder]
    for _ in range(levels):
        parent = os.path.dirname(bases[-1])
        if parent == bases[-1]:
            break
        bases.append(parent)
    return bases


def _read_text(path: str, errors: str = "replace") -> Optional[str]:
    """The text of a module file read for another file's findings (at most 2 MB;
    None when it cannot be read)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(2_000_000).decode("utf-8", errors)
    except OSError:
        return None


# ------------------------------------------------------------------ facts of one module
_PRINT_OVERRIDE = re.compile(r"__builtins?__|\bbuiltins\b")
_RANK_HANDLERS = re.compile(r"addHandler|Filter|basicConfig|setLevel")


def overrides_print_by_rank(src: Source) -> bool:
    """The module replaces ``builtins.print`` under a condition (the rank-aware
    print of many research repositories: ``setup_for_distributed(is_master)``
    defines a ``print`` that calls the original only ``if is_master or force``;
    or ``if rank != 0: builtins.print = print_pass``)."""
    if "print" not in src.text or not _PRINT_OVERRIDE.search(src.text):
        return False
    for node in src.of_type(ast.Assign):
        if not any(_names_builtin_print(src, target) for target in node.targets):
            continue
        scope = src.function_of(node)
        if any(isinstance(anc, ast.If) for anc in src.ancestors(node)):
            return True  # ``if not is_master: builtins.print = print_pass``
        if scope is not None and any(isinstance(n, (ast.If, ast.IfExp)) for n in ast.walk(scope)):
            return True  # the replacement decides inside: ``if is_master or force:``
    return False


def _names_builtin_print(src: Source, target: ast.AST) -> bool:
    """``builtins.print``, ``__builtin__.print``, ``__builtins__["print"]``,
    ``builtins.__dict__["print"]``."""
    if isinstance(target, ast.Attribute) and target.attr == "print":
        return src.qualname(target.value) in ("builtins", "__builtin__") or dotted(target.value) in (
            "builtins",
            "__builtin__",
            "__builtins__",
        )
    if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant) and target.slice.value == "print":
        return dotted(target.value) in ("__builtins__", "builtins.__dict__", "__builtin__.__dict__")
    return False


def configures_logging_by_rank(src: Source) -> bool:
    """The module sets up logging so that info shows on the main process only: a
    handler added only on rank 0 (``if distributed_rank > 0: return logger`` before
    ``logger.addHandler(...)``, or ``addHandler``/``basicConfig`` under ``if rank ==
    0:``), a
    ``logging.Filter`` whose ``filter`` asks for the rank, or a level chosen by
    the rank (``basicConfig(level=INFO if rank in [-1, 0] else WARN)``)."""
    if not _RANK_HANDLERS.search(src.text):
        return False
    for call in src.calls:
        name = last_name(call.func)
        if name in ("addHandler", "basicConfig") and on_main_process_only(src, call):
            return True  # (without a handler, the other ranks' info goes nowhere: DiT's create_logger)
        if name in ("basicConfig", "setLevel"):
            for value in (*call.args, *(k.value for k in call.keywords if k.arg == "level")):
                if isinstance(value, ast.IfExp) and is_rank_dependent(src, value.test):
                    return True
    for cls in src.of_type(ast.ClassDef):
        if not any(last_name(base) == "Filter" for base in cls.bases):
            continue
        for item in cls.body:
            if isinstance(item, ast.FunctionDef) and item.name == "filter":
                if any(is_rank_dependent(src, n.test) for n in ast.walk(item) if isinstance(n, (ast.If, ast.IfExp))):
                    return True
                if any(isinstance(n, ast.Return) and n.value is not None and is_rank_dependent(src, n.value)
                       for n in ast.walk(item)):
                    return True
    return False


def reads_local_rank_from_environment(src: Source) -> bool:
    """``int(os.environ["LOCAL_RANK"])``, ``os.environ.get("LOCAL_RANK", 0)``,
    ``os.getenv("LOCAL_RANK")``: what torchrun sets is read."""
    if "LOCAL_RANK" not in src.text:
        return False
    return any(
        node.value == "LOCAL_RANK" and environ_key(src, src.parent(node)) == "LOCAL_RANK"
        for node in src.of_type(ast.Constant)
    )


# ------------------------------------------------------------------ across the imports
@dataclass(frozen=True)
class ImportedFacts:
    #: ``print`` shows on the main process only (the module or one it imports
    #: replaced ``builtins.print``)
    rank_aware_print: bool = False
    #: logging is set up so that info shows on the main process only
    rank_aware_logging: bool = False
    #: ``LOCAL_RANK`` is read from the environment (``init_distributed_mode``):
    #: what torchrun sets picks the device
    reads_local_rank: bool = False

    def join(self, other: "ImportedFacts") -> "ImportedFacts":
        return ImportedFacts(*(a or b for a, b in zip(self.facts(), other.facts())))

    def facts(self) -> Tuple[bool, bool, bool]:
        return (self.rank_aware_print, self.rank_aware_logging, self.reads_local_rank)


#: facts of module files read for other files, by (path, size, mtime): a process
#: reads each imported module once however many files import it
_MODULE_MEMO: Dict[Tuple[str, int, int], Tuple[ImportedFacts, Tuple[str, ...]]] = {}


def module_facts(path: str) -> Optional[Tuple[ImportedFacts, Tuple[str, ...]]]:
    """The facts of the module file at ``path`` and, for a package's
    ``__init__.py``, the files its own imports name (``from .distributed import
    init_distributed_device``: what ``from timm import utils`` brings); None when
    there is no such file."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    key = (path, stat.st_size, stat.st_mtime_ns)
    if key in _MODULE_MEMO:
        return _MODULE_MEMO[key]
    result: Tuple[ImportedFacts, Tuple[str, ...]] = (ImportedFacts(), ())
    try:
        text = _read_text(path, errors="strict")
        if text is not None:
            facts = ImportedFacts()
            if _PRINT_OVERRIDE.search(text) or _RANK_HANDLERS.search(text) or "LOCAL_RANK" in text:
                module = Source(path, text)
                facts = ImportedFacts(
                    overrides_print_by_rank(module), configures_logging_by_rank(module),
                    reads_local_rank_from_environment(module),
                )
            further = tuple(imported_module_files(path, text)) if os.path.basename(path) == "__init__.py" else ()
            result = (facts, further)
    except (UnicodeDecodeError, SyntaxError, ValueError, RecursionError):
        pass  # (not a module this can read: no facts)
    _MODULE_MEMO[key] = result
    return result


def imported_facts(src: Source) -> ImportedFacts:
    """The file's own facts, joined with those of the modules it imports (one
    level, and through a package's ``__init__.py``: the module that defines
    ``setup_for_distributed`` is imported by the files that print, in the
    repositories that have one)."""
    if "imported_facts" in src.cache:
        return src.cache["imported_facts"]  # type: ignore[return-value]
    facts = ImportedFacts(
        overrides_print_by_rank(src), configures_logging_by_rank(src), reads_local_rank_from_environment(src)
    )
    read: List[str] = []
    if not all(facts.facts()) and not src.path.startswith("<"):
        seen = {os.path.abspath(src.path)}
        todo = list(imported_module_files(src.path, src.text, ANCESTOR_LEVELS))
        while todo:
            candidate = todo.pop(0)
            if candidate in seen:
                continue
            seen.add(candidate)
            found = module_facts(candidate)
            if found is None:
                continue
            read.append(candidate)
            facts = facts.join(found[0])
            todo.extend(found[1])
    src.cache["imported_facts"] = facts
    # (with the importers another rule may have read for this file already)
    src.cache["imported_files"] = tuple(dict.fromkeys([*src.cache.get("imported_files", ()), *read]))
    return facts


# ------------------------------------------------------------------ who imports the file
#: a module file that sets DDP up (read from its text: no parse)
_DDP_TEXT = re.compile(r"DistributedDataParallel|init_process_group|init_distributed_mode")
#: a module file that sets its loaders' epoch (``data_loader_train.sampler.set_epoch(epoch)``)
SETS_EPOCH_TEXT = re.compile(r"\.set_epoch\(")


def imported_by_ddp_code(src: Source) -> bool:
    """A DDP program imports this file: a Python file beside it or in a folder
    above it (``ANCESTOR_LEVELS``) imports its module (``from engine import
    train_one_epoch``, ``import engine``) and sets up DDP.  DETR's, DeiT's and
    MAE's ``engine.py`` holds the training loop that ``main.py`` calls with the
    DDP model."""
    return imported_by(src, _DDP_TEXT)


def imported_by(src: Source, wanted: "re.Pattern[str]") -> bool:
    """A Python file beside this one or in a folder above it (``ANCESTOR_LEVELS``)
    imports its module (``from engine import train_one_epoch``, ``import
    engine``, ``from data import build_loader``) and its text matches ``wanted``."""
    return any(wanted.search(text) for _, text in _importers(src))


def _importers(src: Source) -> List[Tuple[str, str]]:
    """The texts of the files beside this one or in the folders above it that
    import its module (through its package's ``__init__.py`` too), found once per
    file for every question asked of them.  The files read are kept in
    ``src.cache["imported_files"]`` (the cache of the finding follows them; a new
    file that starts importing this one is seen once this file or the cache
    changes -- a folder's mtime is no guide: the cache's own folder changes it)."""
    if "importers" in src.cache:
        return src.cache["importers"]  # type: ignore[return-value]
    texts: List[Tuple[str, str]] = []
    src.cache["importers"] = texts
    if src.path.startswith("<"):
        return texts
    path = os.path.abspath(src.path)
    folder = os.path.dirname(path)
    read = list(src.cache.get("imported_files", ()))
    targets = {os.path.normpath(path)}
    package = os.path.join(folder, "__init__.py")
    if os.path.basename(path) != "__init__.py" and os.path.isfile(package):
        init_text = _read_text(package) or ""
        read.append(package)
        if os.path.normpath(path) in {os.path.normpath(f) for f in imported_module_files(package, init_text)}:
            targets.add(os.path.normpath(package))  # ``from data import build_loader``, re-exported
    for base in _folder_and_above(folder, ANCESTOR_LEVELS):
        try:
            names = sorted(os.listdir(base))
        except OSError:
            continue
        for name in names:
            candidate = os.path.join(base, name)
            if not name.endswith(".py") or os.path.normpath(candidate) in targets:
                continue
            text = _read_text(candidate)
            if text is None:
                continue
            read.append(candidate)  # (an edit may make it an importer)
            if targets & {os.path.normpath(f) for f in imported_module_files(candidate, text, ANCESTOR_LEVELS)}:
                texts.append((candidate, text))
    src.cache["imported_files"] = tuple(dict.fromkeys(read))
    return texts


#: the other modules parsed for this file's facts (importers, imported modules), by (path, text)
_IMPORTER_MEMO: Dict[Tuple[str, str], Optional[Source]] = {}


def _importer_source(path: str, text: str) -> Optional[Source]:
    key = (path, text)
    if key not in _IMPORTER_MEMO:
        try:
            _IMPORTER_MEMO[key] = Source(path, text)
        except (SyntaxError, ValueError, RecursionError):
            _IMPORTER_MEMO[key] = None
    return _IMPORTER_MEMO[key]


def called_only_on_main_by_importers(src: Source, func: ast.AST) -> bool:
    """``func`` -- a function of this file, or a class's ``__init__`` (it runs where
    the class is called) -- is never called in this file, and the files that import
    this one call it, each time where only the main process runs: ConvNeXt's
    ``utils.TensorboardLogger`` makes its ``SummaryWriter`` in ``__init__``, and
    ``main.py`` builds it under ``if global_rank == 0:``.  Calls are matched by the
    name called (``utils.TensorboardLogger(...)``, ``TensorboardLogger(...)``)."""
    name = called_name(src, func)
    if not name or calls_of_name(src, name):
        return False
    found = False
    for path, text in _importers(src):
        if name not in text:
            continue
        importer = _importer_source(path, text)
        if importer is None:
            continue
        for call in calls_of_name(importer, name):
            found = True
            if on_main_process_only(importer, call):
                continue
            outer = importer.function_of(call)
            if outer is None or not called_only_on_main(importer, outer):
                return False
    return found


def runs_only_on_main_by_its_callers(src: Source, node: ast.AST) -> bool:
    """``node`` is in a function that only the main process calls -- here
    (``called_only_on_main``) or, never called here, by the files that import this
    one; in a class's ``__init__``, the class is what is called."""
    func = src.function_of(node)
    return func is not None and (called_only_on_main(src, func) or called_only_on_main_by_importers(src, func))


# ------------------------------------------------------------------ helpers that load checkpoints
def loads_what_it_is_handed(src: Source, call: ast.Call) -> bool:
    """The function ``call`` calls -- defined in this file or in a module it
    imports, found by its name -- calls ``load_state_dict``: the objects handed to
    it may be loaded from a checkpoint (DINO's ``utils.restart_from_checkpoint(path,
    state_dict=linear_classifier)`` loads each keyword's value)."""
    return any(_calls_load_state_dict(f) for _, f in definitions_called(src, call))


def imported_package_roots(src: Source) -> set:
    """The top-level packages the file's names come from (``detectron2`` for
    ``from detectron2.engine import launch``, ``torch_utils`` for the project's own
    ``from torch_utils import distributed as dist``), but not torch's nor the
    standard library's: ``torch.compile(main)``, ``threading.Thread(target=main)``,
    ``functools.partial(main)`` start no process group."""
    import sys

    return {q.split(".")[0] for q in src.aliases.values()} - {"torch", "builtins"} - set(sys.stdlib_module_names)


def project_setup_calls(src: Source) -> List[ast.Call]:
    """The calls of this file into an imported module's function that calls
    ``init_process_group`` (``dist.init()`` of EDM's own wrapper module)."""
    found = src.cache.get("project_setup_calls")
    if found is None:
        roots = imported_package_roots(src)
        found = [
            call for call in src.calls
            if src.qualname(call.func).split(".", 1)[0] in roots and sets_up_the_process_group(src, call)
        ] if roots else []
        src.cache["project_setup_calls"] = found
    return list(found)  # type: ignore[arg-type]


def sets_up_the_process_group(src: Source, call: ast.Call, depth: int = 3) -> bool:
    """The function ``call`` calls (this file's or an imported module's, by its
    name) calls ``init_process_group`` -- itself, or through up to ``depth`` more
    such calls: EDM's ``dist.init()`` of its own ``torch_utils/distributed.py``;
    DINOv2's ``setup(args)`` of ``utils/config.py``, which calls
    ``distributed.enable()``."""
    for module, function in definitions_called(src, call):
        calls = [c for c in ast.walk(function) if isinstance(c, ast.Call)]
        if any(module.qualname(c.func) in N.INIT_PROCESS_GROUP for c in calls):
            return True
        if depth > 0 and any(
            last_name(c.func) != last_name(call.func) and module.qualname(c.func).split(".", 1)[0] != "torch"
            and sets_up_the_process_group(module, c, depth - 1)
            for c in calls
        ):
            return True
    return False


def imported_module_texts(src: Source) -> Dict[str, str]:
    """The texts of the project's module files this file imports (one level: beside
    it, in the folders above, relative imports), read once per file; the files read
    are kept in ``src.cache["imported_files"]`` for the cache."""
    paths = src.cache.get("imported_paths")
    if paths is None:
        paths = () if src.path.startswith("<") else tuple(
            p for p in dict.fromkeys(imported_module_files(src.path, src.text, ANCESTOR_LEVELS)) if os.path.isfile(p)
        )
        src.cache["imported_paths"] = paths
        src.cache["imported_files"] = tuple(dict.fromkeys([*src.cache.get("imported_files", ()), *paths]))
    texts = {}
    for path in paths:  # type: ignore[union-attr]
        text = _current_text(path)  # (read again when the file changed: a module Source is kept)
        if text is not None:
            texts[path] = text
    return texts


#: module texts by (path, size, mtime): read once while the file is unchanged
_TEXT_MEMO: Dict[Tuple[str, int, int], Optional[str]] = {}


def _current_text(path: str) -> Optional[str]:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    key = (path, stat.st_size, stat.st_mtime_ns)
    if key not in _TEXT_MEMO:
        _TEXT_MEMO[key] = _read_text(path)
    return _TEXT_MEMO[key]


def definitions_called(src: Source, call: ast.Call) -> List[Tuple[Source, ast.AST]]:
    """(module, function definition) of what ``call`` calls by its last name:
    this file's top-level functions of that name, else those of the modules the
    file imports (read on disk, one level; ``src.cache["imported_files"]`` keeps
    them for the cache).  Not torch's nor a package's outside the project."""
    name = last_name(call.func)
    if not name:
        return []
    here = [f for f in src.tree.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name == name]
    if here:
        return [(src, f) for f in here]
    if src.path.startswith("<") or src.qualname(call.func).split(".", 1)[0] == "torch":
        return []
    found: List[Tuple[Source, ast.AST]] = []
    for path, text in imported_module_texts(src).items():
        if f"def {name}(" not in text:
            continue
        module = _importer_source(path, text)
        if module is not None:
            found += [(module, f) for f in module.tree.body
                      if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name == name]
    return found


def _calls_load_state_dict(func: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "load_state_dict"
        for n in ast.walk(func)
    )


# ------------------------------------------------------------------ names from installed packages
#: packages whose objects are known (loguru's and absl's loggers log on every process)
_KNOWN_PACKAGES = frozenset({"torch", "builtins", "logging", "loguru", "absl"})


def made_outside_the_project(src: Source, name: str, hops: int = 2) -> bool:
    """``name`` is imported, and -- through up to ``hops`` re-exports by the
    project's own modules -- comes from a module that is not a file of the
    project (an installed package): yolov5's ``from utils.general import LOGGER``,
    where ``utils/general.py`` has ``from ultralytics.utils import LOGGER``.  What
    such an object does (a logger's handlers by rank) is not in the files."""
    qualified = src.aliases.get(name)
    if not qualified or "." not in qualified or src.path.startswith("<"):
        return False
    module, _, attribute = qualified.rpartition(".")
    if module.split(".", 1)[0] in _KNOWN_PACKAGES:
        return False
    folder = os.path.dirname(os.path.abspath(src.path))
    files = [f for base in _folder_and_above(folder, ANCESTOR_LEVELS) for f in module_files(base, module)]
    found = next((f for f in files if os.path.isfile(f)), None)
    if found is None:
        return not any(os.path.isdir(os.path.join(base, *module.split("."))) for base in _folder_and_above(folder, ANCESTOR_LEVELS))
    if hops == 0:
        return False
    text = _read_text(found)
    if text is None or attribute not in text:
        return False
    src.cache["imported_files"] = tuple(dict.fromkeys([*src.cache.get("imported_files", ()), found]))
    module_src = _importer_source(found, text)
    if module_src is None or attribute not in module_src.aliases:
        return False  # (bound there: judged as the project's own)
    return made_outside_the_project(module_src, attribute, hops - 1)
