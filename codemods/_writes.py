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
from dataclasses import dataclass
from typing import List, Optional

from . import _analysis as A

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
