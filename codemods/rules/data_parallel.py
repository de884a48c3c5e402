"""DDP001 data-parallel."""

from __future__ import annotations

import ast
import re
from typing import Iterator

from .. import _names as N
from .._analysis import Source, dotted
from ._base import Diagnostic, Rule


class DataParallelInUse(Rule):
    """
    ## What it does
    Finds `torch.nn.DataParallel` in every spelling (`nn.DataParallel`,
    `nn.parallel.DataParallel`, `from torch.nn.parallel import DataParallel as DP`),
    resolved through the file's imports; a project's own class named
    `DataParallel` is not torch's and is not reported. Subclasses of it and the
    functional `torch.nn.parallel.data_parallel` are reported too.

    ## Why is this bad?
    DataParallel is one process driving every GPU from threads: the model is
    replicated and the outputs gathered on GPU 0 at every step, and the Python
    GIL serialises the work, so it scales poorly and GPU 0 runs out of memory
    first. PyTorch recommends DistributedDataParallel even on a single machine.

    ## Example
    ```python
    model = nn.DataParallel(model).cuda()
    ```

    ## Use instead
    ```python
    model = DistributedDataParallel(model.to(device), device_ids=[local_rank])
    ```
    launched with `torchrun --nproc_per_node=N`. `dp2ddp convert` does the whole
    migration (process group, sampler, checkpoints, logging).

    ## Fix safety
    Safe: the fix is the `dp2ddp convert` migration, which keeps the training
    math (the global batch is split across the processes) and keeps the script
    runnable with plain `python` as a world of one. Spots it cannot convert are
    left as they are and reported.
    """

    CODE = "DDP001"
    NAME = "data-parallel"
    SEVERITY = "error"
    MESSAGE = "DataParallel in use: migrate to DistributedDataParallel (`dp2ddp convert`)"
    FIX = "safe"
    FIX_TRANSFORMS = ("*",)
    FIX_DESCRIPTION = "convert the program to DistributedDataParallel"
    TRIGGERS = ("DataParallel", "data_parallel")

    def check(self, src: Source) -> Iterator[Diagnostic]:
        for node in src.calls_to(N.ANY_DATA_PARALLEL):
            if src.qualname(node.func) in N.DATA_PARALLEL:
                head = dotted(node.func).split(".")[0]
                if head not in src.aliases and "import *" in src.text:
                    # torch reaches the file through a star import: convert cannot
                    # resolve it, so no fix is offered (it would change nothing)
                    found = self.diagnostic(
                        src, node, f"{self.MESSAGE}; `{head}` comes through `import *`: import it "
                        "explicitly so that `dp2ddp convert` can resolve it"
                    )
                    found.fix = None
                    yield found
                    continue
                yield self.diagnostic(src, node)
            else:
                yield self.diagnostic(
                    src, node, "functional data_parallel() in use: call a DDP-wrapped module instead"
                )
        for node in _bare_references(src):
            found = self.diagnostic(
                src, node, "DataParallel referenced, not called here (an alias, a factory argument): "
                "the wrap made through it is not converted; use DistributedDataParallel",
            )
            found.fix = None
            yield found
        for node in src.of_type(ast.ClassDef):
            for base in node.bases:
                if src.qualname(base) in N.DATA_PARALLEL:
                    yield self.diagnostic(
                        src, node, f"class {node.name} subclasses DataParallel: port it to DDP"
                    )


_DATA_PARALLEL_WORD = re.compile(r"(?<!Distributed)DataParallel")


def _bare_references(src: Source) -> Iterator[ast.AST]:
    """``wrap = nn.DataParallel``, ``build(model, nn.DataParallel)``, a default
    ``parallel=nn.DataParallel``: DataParallel named where it may be called later.
    A type test is harmless -- ``isinstance``/``issubclass``, ``type(m) in (...)``,
    ``is``/``==``, a tuple, list or set of types (``DP_TYPES = (DataParallel, DDP)``),
    an annotation -- and so are a class's bases and imports (reported elsewhere)."""
    if not _DATA_PARALLEL_WORD.search(src.text):
        return
    # the local names bound to DataParallel by an import (``DataParallel``, ``DP``)
    names = {local for local, qualified in src.aliases.items() if qualified in N.DATA_PARALLEL}
    # the calls' and the classes' own names need no parent lookup (the usual case:
    # ``nn.DataParallel(model)``), so most files never build the parent index here
    explained = {id(c.func) for c in src.calls}
    explained |= {id(b) for c in src.of_type(ast.ClassDef) for b in c.bases}
    for node in src.of_type(ast.Attribute, ast.Name):
        if not (
            isinstance(node, ast.Attribute) and node.attr == "DataParallel"
            or isinstance(node, ast.Name) and node.id in names
        ) or id(node) in explained:
            continue
        if src.qualname(node) not in N.DATA_PARALLEL:
            continue
        parent = src.parent(node)
        if isinstance(parent, ast.Call) and parent.func is node or isinstance(parent, ast.ClassDef):
            continue
        if isinstance(parent, ast.Attribute):
            continue  # ``nn.DataParallel.forward``: an attribute of the class, not the class
        if not _type_use(src, node):
            yield node


def _type_use(src: Source, node: ast.AST) -> bool:
    """``node`` is used as a type: in a comparison (``type(m) is DataParallel``,
    ``type(m) in (...)``), an ``isinstance``/``issubclass`` test -- also through a
    tuple, list or set of types, or a name holding one that only such tests use
    (``DP_TYPES = (DataParallel, DDP)``) -- or an annotation.  A list of wrappers
    that is iterated or called (``for wrap in [nn.DataParallel]``) is not."""
    child = node
    in_collection = False
    for parent in src.ancestors(node):
        if isinstance(parent, ast.Compare):
            return True
        if isinstance(parent, (ast.Tuple, ast.List, ast.Set)):
            in_collection, child = True, parent
            continue
        if isinstance(parent, ast.Call):
            return _type_test(parent)
        if in_collection and isinstance(parent, ast.Assign) and child is parent.value:
            names = {t.id for t in parent.targets if isinstance(t, ast.Name)}
            return _types_only(src, names)
        if isinstance(parent, (ast.arg, ast.AnnAssign)) and child is getattr(parent, "annotation", None):
            return True
        if isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)) and child is parent.returns:
            return True
        if isinstance(parent, (ast.Subscript, ast.BinOp)):  # Optional[DataParallel], A | B
            child = parent
            continue
        return False
    return False


def _types_only(src: Source, names: set) -> bool:
    """A collection held by ``names`` serves type tests: some use reaches an
    ``isinstance``/``issubclass`` or a comparison -- directly, through a loop or
    comprehension variable over it (``any(isinstance(m, t) for t in DP_TYPES)``),
    or through a parameter it is the default of -- and nothing calls its items
    (``for wrap in WRAPPERS: model = wrap(model)``, ``WRAPPERS[0](model)``)."""
    tested = called = False
    todo, seen = set(names), set()
    while todo:
        name = todo.pop()
        seen.add(name)
        for use in src.nodes:
            if not (isinstance(use, ast.Name) and use.id == name and isinstance(use.ctx, ast.Load)):
                continue
            parent = src.parent(use)
            if _type_test(parent) or isinstance(parent, ast.Compare):
                tested = True
            elif isinstance(parent, ast.Call) and parent.func is use:
                called = True
            elif isinstance(parent, ast.Subscript) and isinstance(src.parent(parent), ast.Call) and src.parent(parent).func is parent:
                called = True
            elif isinstance(parent, (ast.For, ast.comprehension)) and parent.iter is use and isinstance(parent.target, ast.Name):
                todo |= {parent.target.id} - seen  # the items, one at a time
            elif isinstance(parent, ast.arguments):
                defaults = list(parent.defaults)
                params = (parent.posonlyargs + parent.args)[len(parent.posonlyargs + parent.args) - len(defaults):]
                todo |= {a.arg for a, d in zip(params, defaults) if d is use} - seen
                todo |= {a.arg for a, d in zip(parent.kwonlyargs, parent.kw_defaults) if d is use} - seen
    return tested and not called


def _type_test(node) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("isinstance", "issubclass")
