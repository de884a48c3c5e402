"""Shared recognisers of the file-system writes that race between ranks.

One decision per pitfall: lint's DDP302 (``rules/save_on_every_rank.py``) and
convert's save-on-main (``save_on_main.py``) both ask these functions, on the
standard library's ``ast`` (``_analysis.Source``), what races; the transform
only edits where they point.

* ``folder_creations``: ``if not os.path.isdir(d): os.makedirs(d)`` (or
  ``os.mkdir``, ``os.path.exists``), and a bare ``os.makedirs(d)`` without
  ``exist_ok=True``: every rank checks, every rank creates, and the loser of
  the race gets ``FileExistsError``.  The fix is ``os.makedirs(d,
  exist_ok=True)``, safe on every rank.
* ``frame_writes``: pandas' ``df.to_csv(path)`` / ``to_json`` / ``to_parquet`` /
  ``to_pickle``... (a method of a DataFrame-like object, a path first) on a path
  every rank shares: the same file written by each, like ``torch.save``.
* ``removals``: ``shutil.rmtree(p)`` / ``os.remove(p)`` of a shared path (often
  ``if os.path.isdir(p): shutil.rmtree(p)`` at start-up): the second rank finds
  nothing to remove (``FileNotFoundError``) or removes what another rank just
  wrote.  The fix puts it on the main process, then ``dist.barrier()``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Set

from . import _analysis as A
from . import _names as N

#: what creates a folder (``os.mkdir`` fails when it exists, ``os.makedirs`` unless ``exist_ok``)
MAKE_FOLDER = frozenset({"os.mkdir", "os.makedirs"})
#: what removes a file or a folder tree
REMOVE_PATH = frozenset({"shutil.rmtree", "os.remove", "os.unlink", "os.rmdir"})
#: what tests for a path before creating or removing it
PATH_TESTS = frozenset({"os.path.isdir", "os.path.exists", "os.path.isfile", "os.path.lexists"})
#: what lists a folder: a loop over it may run a different number of times on each rank
LISTINGS = frozenset({"glob", "iglob", "listdir", "scandir", "walk", "iterdir", "rglob"})


#: a DataFrame's (or Series') methods that write a whole file, path first
FRAME_WRITE_METHODS = frozenset(
    {"to_csv", "to_json", "to_parquet", "to_pickle", "to_excel", "to_feather", "to_hdf", "to_orc", "to_stata"}
)
#: their keyword for the path
FRAME_PATH_KEYWORDS = ("path_or_buf", "path", "excel_writer", "fname")
#: what reads such a file back: a write of it then needs a barrier
FRAME_READS = frozenset(
    {"pandas.read_csv", "pandas.read_json", "pandas.read_parquet", "pandas.read_pickle", "pandas.read_excel",
     "pandas.read_feather", "pandas.read_hdf"}
)


@dataclass
class FolderCreation:
    """A folder creation that fails on every rank but the first to get there."""

    call: ast.Call
    #: ``if not os.path.isdir(d): os.makedirs(d)`` with nothing else in it: the
    #: ``if`` goes, the call stays (with ``exist_ok=True``); else None
    check: Optional[ast.If]


@dataclass
class Removal:
    """A removal of a path every rank shares."""

    call: ast.Call
    #: the statement to put on the main process: the call's own, or the ``if
    #: os.path.isdir(p):`` that holds only removals
    stmt: ast.stmt
    #: why it cannot be fixed by a guard and a barrier (None: it can)
    unfixable: Optional[str] = None


def folder_creations(src: A.Source) -> List[FolderCreation]:
    """``os.mkdir(d)`` and ``os.makedirs(d)`` (without ``exist_ok=True``) on a path
    that is not this rank's own, not in a ``try`` that catches the failure."""
    found = []
    for call in src.calls_to(MAKE_FOLDER):
        exist_ok = A.keyword(call, "exist_ok")
        if exist_ok is not None and not A.is_false(exist_ok):
            continue
        if src.qualname(call.func) == "os.mkdir" and A.keyword(call, "dir_fd") is not None:
            continue
        path = A.argument(call, 0, "name" if src.qualname(call.func) == "os.makedirs" else "path")
        if path is None or A.per_rank_target(src, path) or _caught(src, call, ("FileExistsError", "OSError")):
            continue
        found.append(FolderCreation(call, _check_then_create(src, call, path)))
    return found


def _check_then_create(src: A.Source, call: ast.Call, path: ast.AST) -> Optional[ast.If]:
    """The ``if not os.path.isdir(P):`` whose only statement is ``call`` on ``P``."""
    stmt = src.parent(call)
    owner = src.parent(stmt) if isinstance(stmt, ast.Expr) else None
    if not (isinstance(owner, ast.If) and owner.body == [stmt] and not owner.orelse):
        return None
    test = owner.test
    if not (isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and isinstance(test.operand, ast.Call)):
        return None
    probe = test.operand
    if src.qualname(probe.func) not in PATH_TESTS or len(probe.args) != 1 or probe.keywords:
        return None
    return owner if ast.dump(probe.args[0]) == ast.dump(path) else None


def frame_target(call: ast.Call) -> Optional[ast.AST]:
    """The path of ``df.to_csv(path)`` (None for ``df.to_csv()``, which returns the text)."""
    if not (isinstance(call.func, ast.Attribute) and call.func.attr in FRAME_WRITE_METHODS):
        return None
    if call.args and not isinstance(call.args[0], ast.Starred):
        target = call.args[0]
    else:
        target = next((k.value for k in call.keywords if k.arg in FRAME_PATH_KEYWORDS), None)
    return None if target is None or A.is_none(target) else target


def frame_writes(src: A.Source) -> List[ast.Call]:
    """``df.to_csv(path)`` and the like to a path that is not this rank's own (nor
    an in-memory buffer)."""
    found = []
    for call in src.calls:
        target = frame_target(call)
        if target is None or A.per_rank_target(src, target):
            continue
        if isinstance(target, ast.Name) and any(
            isinstance(v, ast.Call) and A.last_name(v.func) == "open" for v in A.bound_values(src, target.id, with_items=True)
        ):
            continue  # a file object opened here (``with open(p, "w") as f: df.to_csv(f)``): the open decides
        found.append(call)
    return found


def frame_write_is_pure(src: A.Source, call: ast.Call) -> bool:
    """What ``df.to_csv(path)`` writes, and where, computes nothing but a pandas
    object (``pd.DataFrame(history).to_csv(path)``): it may go behind a
    main-process check."""
    receiver = call.func.value  # type: ignore[attr-defined]
    if isinstance(receiver, ast.Call) and src.qualname(receiver.func).startswith("pandas."):
        parts = [*receiver.args, *(k.value for k in receiver.keywords)]
    else:
        parts = [receiver]
    parts += [*call.args, *(k.value for k in call.keywords)]
    return all(A.is_pure(p) for p in parts)


def removals(src: A.Source) -> List[Removal]:
    """``shutil.rmtree(p)``, ``os.remove(p)``... of a path that is not this rank's
    own (``per_rank_target``), with the statement to guard."""
    found = []
    for call in src.calls_to(REMOVE_PATH):
        path = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg in ("path", "src")), None)
        if path is None or A.per_rank_target(src, path):
            continue
        stmt = src.parent(call)
        if not isinstance(stmt, ast.Expr):
            found.append(Removal(call, _statement_of(src, call), "the removal is part of an expression"))
            continue
        owner = src.parent(stmt)
        while (
            isinstance(owner, ast.If) and stmt in owner.body and not owner.orelse
            and A.is_pure(owner.test) and all(_removes(src, s) for s in owner.body)
        ):
            stmt, owner = owner, src.parent(owner)
        unfixable = None
        if not all(A.is_pure(a) for a in (*call.args, *(k.value for k in call.keywords))):
            unfixable = "what it removes is computed there"
        elif _in_listing_loop(src, call):
            unfixable = "it is in a loop over a folder's listing, which may differ between ranks: no barrier can go in it"
        found.append(Removal(call, stmt, unfixable))
    return found


def _statement_of(src: A.Source, node: ast.AST) -> ast.AST:
    for anc in src.ancestors(node):
        if isinstance(anc, ast.stmt):
            return anc
    return node


def _removes(src: A.Source, stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and src.is_call(stmt.value, REMOVE_PATH) or (
        isinstance(stmt, ast.If) and not stmt.orelse and A.is_pure(stmt.test) and all(_removes(src, s) for s in stmt.body)
    )


def _in_listing_loop(src: A.Source, node: ast.AST) -> bool:
    for anc in src.ancestors(node):
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
        if isinstance(anc, (ast.For, ast.AsyncFor)) and any(
            isinstance(n, ast.Call) and A.last_name(n.func) in LISTINGS for n in ast.walk(anc.iter)
        ):
            return True
        if isinstance(anc, ast.While):
            return True  # (how often it runs on each rank is not known here)
    return False


def _caught(src: A.Source, node: ast.AST, errors) -> bool:
    """``node`` is in the body of a ``try`` with a handler for one of ``errors``
    (or a bare / ``Exception`` one)."""
    child = node
    for anc in src.ancestors(node):
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return False
        if isinstance(anc, ast.Try) and child in anc.body:
            for handler in anc.handlers:
                names = [] if handler.type is None else (
                    handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
                )
                if handler.type is None or any(A.last_name(n) in (*errors, "Exception", "BaseException") for n in names):
                    return True
        child = anc
    return False


def every_rank(src: A.Source, node: ast.AST) -> bool:
    """``node`` runs on every rank of DDP code: not under a main-process check,
    and not in a function this file calls only there (nor one it never calls)."""
    if A.on_main_process_only(src, node):
        return False
    func = src.function_of(node)
    return func is None or A.called_unguarded(src, func)


FOLDER_MESSAGE = (
    "every rank creates this folder (the same path on each): all but the first get "
    "FileExistsError; use os.makedirs(path, exist_ok=True)"
)
REMOVAL_MESSAGE = (
    "every rank removes this path (the same on each): the others find it gone (FileNotFoundError) "
    "or remove what a rank just wrote; remove it on the main process only, then dist.barrier()"
)


# ------------------------------------------------------------------ objects made on the main process only
#: what a logged value may compute behind a main-process check, besides the harmless
#: calls (``_names.HARMLESS_*``): a tensor's statistics and a scheduler's learning rate
#: -- no model forward, no collective
LOGGED_VALUE_METHODS = frozenset(
    {"norm", "std", "var", "abs", "float", "double", "clone", "max", "min", "median", "argmax", "argmin",
     "histc", "flatten", "view", "reshape", "square", "pow", "get_lr", "get_last_lr", "mean", "sum", "item",
     "detach", "cpu", "tolist", "numel", "size"}
)


def main_only_bindings(src: A.Source) -> Set[str]:
    """The names (``writer``, ``self.writer``) bound to an object made on the main
    process only -- ``SummaryWriter(d) if dist.get_rank() == 0 else None``, ``None
    if rank != 0 else X``, or ``writer = None`` and, under a main-process check,
    ``writer = X(...)``: None on the other ranks."""
    names: Set[str] = set()
    nones: Set[str] = set()
    guarded: Set[str] = set()
    for node in src.of_type(ast.Assign):
        value = node.value
        targets = {A.dotted(t) for t in node.targets} - {""}
        if isinstance(value, ast.IfExp) and (
            A.is_none(value.orelse) and A.is_main_process_check(src, value.test)
            or A.is_none(value.body) and A.is_not_main_check(src, value.test)
        ):
            names |= targets
        elif A.is_none(value):
            nones |= targets
        elif isinstance(value, ast.Call) and A.on_main_process_only(src, node):
            guarded |= targets
    return _set_from_main_only(src, names | (nones & guarded), nones)


def _set_from_main_only(src: A.Source, known: Set[str], nones: Set[str]) -> Set[str]:
    """``known`` and the names first bound to None and then only where the main
    process alone runs or under a check that one of ``known`` is there: timm's
    ``best_metric = None`` ... ``if saver is not None: best_metric, best_epoch =
    saver.save_checkpoint(...)``, with the saver made on the main process only."""
    bindings: Dict[str, List[ast.AST]] = {}
    for node in src.of_type(ast.Assign):
        if A.is_none(node.value):
            continue
        for target in node.targets:
            for element in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]):
                name = A.dotted(element)
                if name in nones and name not in known:
                    bindings.setdefault(name, []).append(node)
    for node in src.of_type(ast.AugAssign, ast.AnnAssign, ast.For, ast.AsyncFor, ast.withitem, ast.NamedExpr,
                            ast.comprehension):
        target = getattr(node, "optional_vars", None) if isinstance(node, ast.withitem) else node.target
        for element in ast.walk(target) if target is not None else ():
            bindings.pop(A.dotted(element), None)  # bound otherwise too: not followed
    known = set(known)
    grew = bool(bindings)
    while grew:
        grew = False
        for name, assigns in bindings.items():
            if name not in known and all(
                A.on_main_process_only(src, a) or any(_none_checked(src, a, k) for k in known) for a in assigns
            ):
                known.add(name)
                grew = True
    return known


def checked_present(src: A.Source, node: ast.AST, names: Set[str]) -> bool:
    """``node`` runs only where one of ``names`` is not None (``if best_metric is
    not None:``, ``if writer:``, after ``if writer is None: return``)."""
    return any(_none_checked(src, node, name) for name in names)


def main_only_names(src: A.Source, seeds: Set[str]) -> Set[str]:
    """``seeds`` and the parameters of this file's functions that one of them is
    handed to (``train_one_epoch(epoch, writer)`` -> its ``tb`` parameter)."""
    names = set(seeds)
    functions: Dict[str, List[ast.AST]] = {}
    for func in src.of_type(ast.FunctionDef, ast.AsyncFunctionDef):
        functions.setdefault(func.name, []).append(func)
    grew = True
    while grew:
        grew = False
        for call in src.calls:
            for func in functions.get(A.last_name(call.func), ()):
                params = [a.arg for a in (*func.args.posonlyargs, *func.args.args)]
                if isinstance(call.func, ast.Attribute) and params[:1] in (["self"], ["cls"]):
                    params = params[1:]
                handed = [p for p, a in zip(params, call.args) if A.dotted(a) in names]
                handed += [k.arg for k in call.keywords if k.arg in params and A.dotted(k.value) in names]
                for param in handed:
                    if param not in names:
                        names.add(param)
                        grew = True
    return names


def unguarded_uses(src: A.Source, names: Set[str]) -> List[ast.AST]:
    """The uses of ``names`` (objects that are None on the other ranks) that every
    rank runs: not under a main-process check or a None check (``if writer is not
    None:``, ``if writer:``, ``writer and ...``, after ``if writer is None: return``),
    not in a function called only on the main process, and not handed to a function
    of this file (``main_only_names`` follows it there)."""
    if not names:
        return []
    found = []
    for node in src.nodes:
        if isinstance(node, ast.Name):
            name = node.id
        elif isinstance(node, ast.Attribute):
            name = A.dotted(node)
        else:
            continue
        if name not in names or not isinstance(node.ctx, ast.Load):
            continue
        parent = src.parent(node)
        if not _dereferences(parent, node):
            continue  # ``return writer``, ``if writer:``, ``f(writer)``: None is only passed on
        if _none_checked(src, node, name) or A.on_main_process_only(src, node):
            continue
        func = src.function_of(node)
        if func is not None and A.called_only_on_main(src, func):
            continue
        found.append(node)
    return found


def _dereferences(parent: Optional[ast.AST], node: ast.AST) -> bool:
    """``parent`` uses ``node`` in a way that fails when it is None: an attribute
    (``writer.add_scalar``), a subscript, a call, ``for ... in writer``, ``with writer:``.
    (Handed on -- returned, stored, an argument -- it is followed, or not a crash here.)"""
    if isinstance(parent, (ast.Attribute, ast.Subscript)):
        return parent.value is node
    if isinstance(parent, ast.Call):
        return parent.func is node
    if isinstance(parent, (ast.For, ast.AsyncFor, ast.comprehension)):
        return parent.iter is node
    if isinstance(parent, ast.withitem):
        return parent.context_expr is node
    return False


def _present(test: ast.AST, name: str) -> bool:
    """``test`` is true only when ``name`` is not None."""
    if A.dotted(test) == name:
        return True
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.IsNot, ast.NotEq)):
        return A.dotted(test.left) == name and A.is_none(test.comparators[0])
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(_present(v, name) for v in test.values)
    return False


def _absent(test: ast.AST, name: str) -> bool:
    """``test`` is true whenever ``name`` is None."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return A.dotted(test.operand) == name
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Is, ast.Eq)):
        return A.dotted(test.left) == name and A.is_none(test.comparators[0])
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        return any(_absent(v, name) for v in test.values)
    return False


def _none_checked(src: A.Source, node: ast.AST, name: str) -> bool:
    child = node
    for anc in src.ancestors(node):
        if isinstance(anc, (ast.If, ast.While)) and child is not anc.test:
            if child in anc.body and _present(anc.test, name) or child in anc.orelse and _absent(anc.test, name):
                return True
        if isinstance(anc, ast.IfExp) and child is not anc.test:
            if child is anc.body and _present(anc.test, name) or child is anc.orelse and _absent(anc.test, name):
                return True
        if isinstance(anc, ast.BoolOp) and child in anc.values:
            before = anc.values[: anc.values.index(child)]
            if any((_present if isinstance(anc.op, ast.And) else _absent)(v, name) for v in before):
                return True
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef)):
            line = getattr(node, "lineno", 0)
            return any(
                isinstance(s, ast.If) and s.lineno < line and _absent(s.test, name) and s.body
                and isinstance(s.body[-1], (ast.Return, ast.Raise))
                for s in anc.body
            )
        child = anc
    return False


MAIN_ONLY_USE_MESSAGE = (
    "{name} is None on every rank but the main process (made there only), and this runs on "
    "every rank: it crashes there; use it under the same main-process check (or `if {name} is not None:`)"
)


# ------------------------------------------------------------------ a project's own file loggers
@dataclass
class FileLogger:
    """A class of this file whose methods write a file (``open(P, "a").write(...)``,
    ``self.f = open(P, "a")`` and ``self.f.write(...)``, ``with open(P, "w") as f:``)."""

    cls: ast.ClassDef
    #: its methods that write (themselves, or through another of its methods)
    methods: Set[str]
    #: a file it keeps open was opened with "w" (truncated): one rank's open can
    #: empty what another already wrote, so guarding the calls is not enough
    truncates: bool


def file_loggers(src: A.Source) -> Dict[str, FileLogger]:
    """The classes of this file that write a file from their methods, by name."""
    cached = src.cache.get("file_loggers")
    if cached is None:
        cached = src.cache["file_loggers"] = _file_loggers(src)
    return cached  # type: ignore[return-value]


def _file_loggers(src: A.Source) -> Dict[str, FileLogger]:
    found = {}
    for cls in src.of_type(ast.ClassDef):
        methods = {f.name: f for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
        handles: Dict[str, str] = {}  # self.f -> its open's mode
        for method in methods.values():
            for node in ast.walk(method):
                if isinstance(node, ast.Assign) and _opens(src, node.value):
                    for target in node.targets:
                        if A.dotted(target).startswith("self."):
                            handles[A.dotted(target)] = _mode(node.value)
        writing = {name for name, f in methods.items() if _writes_file(src, f, handles)}
        grew = True
        while grew:
            grew = False
            for name, f in methods.items():
                if name not in writing and any(
                    isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and A.dotted(c.func.value) == "self"
                    and c.func.attr in writing for c in ast.walk(f)
                ):
                    writing.add(name)
                    grew = True
        writing.discard("__init__")
        if writing:
            found[cls.name] = FileLogger(cls, writing, any("w" in m or "x" in m for m in handles.values()))
    return found


def _opens(src: A.Source, node: ast.AST) -> bool:
    """``open(P, mode)`` with a literal mode that writes, on a path that is not
    this rank's own."""
    if not (isinstance(node, ast.Call) and src.qualname(node.func) in ("builtins.open", "io.open") and node.args):
        return False
    return any(c in _mode(node) for c in "wax+") and not A.per_rank_target(src, node.args[0])


def _mode(call: ast.Call) -> str:
    mode = call.args[1] if len(call.args) > 1 else A.keyword(call, "mode")
    return mode.value if isinstance(mode, ast.Constant) and isinstance(mode.value, str) else ""


def _writes_file(src: A.Source, func: ast.AST, handles: Dict[str, str]) -> bool:
    for node in ast.walk(func):
        if isinstance(node, ast.withitem) and _opens(src, node.context_expr):
            return True
        if not isinstance(node, ast.Call):
            continue
        target = node.func.value if isinstance(node.func, ast.Attribute) else None
        if isinstance(node.func, ast.Attribute) and node.func.attr in ("write", "writelines") and (
            _opens(src, target) or A.dotted(target) in handles
        ):
            return True  # open(P, "a").write(...), self.f.write(...)
        handle = A.keyword(node, "file")
        if handle is not None and (_opens(src, handle) or A.dotted(handle) in handles):
            return True  # print(..., file=self.f)
        if any(_opens(src, a) for a in node.args) and src.qualname(node.func) in N.WRITE_DUMPS:
            return True  # json.dump(x, open(P, "w"))
    return False


def file_logger_calls(src: A.Source) -> List[ast.Call]:
    """Calls of a writing method of an object of a ``file_loggers`` class of this
    file (``writer = Writer("log.txt")`` ... ``writer.add_scalar(...)``), whose
    instance's arguments do not name the rank (``Writer(f"log_{rank}.txt")``)."""
    loggers = file_loggers(src)
    if not loggers:
        return []
    instances: Dict[str, FileLogger] = {}
    for node in src.of_type(ast.Assign):
        value = node.value
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in loggers:
            if any(A.per_rank_target(src, a) for a in (*value.args, *(k.value for k in value.keywords))):
                continue
            for target in node.targets:
                if A.dotted(target):
                    instances[A.dotted(target)] = loggers[value.func.id]
    return [
        call for call in src.calls
        if isinstance(call.func, ast.Attribute) and A.dotted(call.func.value) in instances
        and call.func.attr in instances[A.dotted(call.func.value)].methods
    ]


def logger_of(src: A.Source, call: ast.Call) -> Optional[FileLogger]:
    """The ``file_loggers`` class of the object whose method ``call`` calls."""
    for node in src.of_type(ast.Assign):
        if isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) and any(
            A.dotted(t) == A.dotted(call.func.value) for t in node.targets  # type: ignore[attr-defined]
        ):
            return file_loggers(src).get(node.value.func.id)
    return None


FILE_LOGGER_MESSAGE = (
    "{cls}.{method}() writes a file (opened in {cls}'s methods, the same path on every rank): every rank "
    "writes its lines into it; call it on the main process only (if dist.get_rank() == 0), or give each rank its own file"
)
FILE_LOGGER_TRUNCATES = (
    " -- {cls} keeps the file open from mode \"w\" on every rank, so one rank's open can empty what another "
    "wrote: make the {cls} on the main process only too"
)


# ------------------------------------------------------------------ a file of samples drawn through the model
#: method calls that may reach a collective or change the model (never behind a main-process check)
_TRAINING_OR_COLLECTIVE = frozenset(
    {"backward", "step", "zero_grad", "all_reduce", "all_gather", "broadcast", "barrier", "reduce",
     "gather", "scatter", "reduce_scatter", "all_to_all", "train", "load_state_dict"}
)


def sampled_through_the_model(src: A.Source, stmt: ast.With) -> Optional[Set[str]]:
    """The DDP models (names bound to ``DistributedDataParallel(...)``) whose forward
    a ``with open(P, "w") as f:`` calls to draw what it writes -- text sampled word
    by word, the ``f.write(word)`` inside the loop (``long_lived_writer``) -- when
    nothing else in it can reach a collective: no backward or optimizer step, no
    ``torch.distributed`` call, no function of the program's own (only builtins,
    torch's functions and methods of the values).  Such a block can run on the main
    process only, through ``model.module`` (no DDP forward on one rank).  None
    otherwise."""
    if A.long_lived_writer(src, stmt) is None:
        return None
    models = A.ddp_wrapped_names(src)
    called: Set[str] = set()
    for node in ast.walk(ast.Module(body=stmt.body, type_ignores=[])):
        if not isinstance(node, ast.Call):
            continue
        name = src.qualname(node.func)
        if A.dotted(node.func) in models:
            called.add(A.dotted(node.func))
        elif name.startswith("torch.distributed") or A.last_name(node.func) in _TRAINING_OR_COLLECTIVE:
            return None
        elif isinstance(node.func, ast.Name):
            if not (node.func.id in N.HARMLESS_FUNCS or name.startswith("torch.") or name.startswith("builtins.")):
                return None  # (a function of the program: it may run anything)
        elif isinstance(node.func, ast.Attribute) and A.dotted(node.func.value) in models:
            return None  # (model.generate(...), model.sample(...): through DDP's attribute lookup)
    return called or None


# ------------------------------------------------------------------ rank 0 first, then the others
#: ``with torch_distributed_zero_first(rank):`` (yolov5, older transformers examples),
#: ``with accelerator.main_process_first():``, ``training_args.main_process_first()``
_MAIN_FIRST = re.compile(r"(?i)(zero|main_process|main|master|rank_?0|leader)_first$")


def built_main_process_first(src: A.Source, node: ast.AST, depth: int = 3) -> bool:
    """``node`` runs only inside ``with torch_distributed_zero_first(rank):``
    blocks -- there, or in a function (a class's ``__init__`` and methods through
    ``self.``) called only from such blocks, ``depth`` calls deep: the main process
    builds first (a dataset's label cache, yolov5) while the others wait, and they
    then find what it wrote (the load-or-build pattern)."""
    child = node
    for anc in src.ancestors(node):
        if isinstance(anc, ast.With) and child not in anc.items and any(
            isinstance(i.context_expr, ast.Call) and _MAIN_FIRST.search(A.last_name(i.context_expr.func))
            for i in anc.items
        ):
            return True
        if isinstance(anc, (ast.FunctionDef, ast.AsyncFunctionDef)):
            break
        child = anc
    func = src.function_of(node)
    if func is None or depth == 0:
        return False
    calls = A.calls_of(src, func)
    return bool(calls) and all(built_main_process_first(src, c, depth - 1) for c in calls)
