"""Per-file facts that decide each file's role in the program (see ``FileRole``).

One cheap metadata pass over the original module: does it train, wrap with
DataParallel, set up DDP already, have a ``__main__`` block or module-level
training, and which project modules does it import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Set, Tuple

import libcst as cst
import libcst.matchers as m
from libcst.metadata import MetadataWrapper, QualifiedNameProvider

from . import _names as N
from ._patterns import dotted_name


@dataclass
class FileFacts:
    uses_torch: bool = False
    has_data_parallel: bool = False
    already_distributed: bool = False
    trains: bool = False
    has_main_guard: bool = False
    main_guard_trains: bool = False
    module_level_trains: bool = False
    #: absolute module names imported, and (level, module) for relative imports
    imports: Set[str] = field(default_factory=set)
    relative_imports: Set[Tuple[int, str]] = field(default_factory=set)
    #: names of module-level functions called from the __main__ block
    main_calls: Set[str] = field(default_factory=set)


class _FactsVisitor(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (QualifiedNameProvider,)

    def __init__(self, facts: FileFacts) -> None:
        super().__init__()
        self.facts = facts
        self._depth = 0  # function/class nesting
        self._in_main = 0

    def _q(self, node: cst.CSTNode) -> Set[str]:
        return {q.name for q in self.get_metadata(QualifiedNameProvider, node, set())}

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            name = dotted_name(alias.name)
            self.facts.imports.add(name)
            if name == "torch" or name.startswith("torch."):
                self.facts.uses_torch = True

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        module = dotted_name(node.module) if node.module else ""
        level = len(node.relative)
        names = [] if isinstance(node.names, cst.ImportStar) else [
            dotted_name(a.name) for a in node.names
        ]
        if level:
            self.facts.relative_imports.add((level, module))
            for name in names:
                self.facts.relative_imports.add((level, f"{module}.{name}" if module else name))
        else:
            self.facts.imports.add(module)
            for name in names:
                self.facts.imports.add(f"{module}.{name}")
            if module == "torch" or module.startswith("torch."):
                self.facts.uses_torch = True

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._depth += 1

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._depth -= 1

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._depth += 1

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self._depth -= 1

    def visit_If(self, node: cst.If) -> None:
        if self._depth == 0 and _is_main_guard(node):
            self.facts.has_main_guard = True
            self._in_main += 1

    def leave_If(self, node: cst.If) -> None:
        if self._depth == 0 and _is_main_guard(node):
            self._in_main -= 1

    def visit_Call(self, node: cst.Call) -> None:
        names = self._q(node.func)
        trains = False
        if names & N.DATA_PARALLEL:
            self.facts.has_data_parallel = True
        if names & (N.INIT_PROCESS_GROUP | N.DDP | N.SPAWN):
            self.facts.already_distributed = True
        if any(N.is_optimizer(n) for n in names) or m.matches(
            node.func, m.Attribute(attr=m.Name("backward"))
        ):
            trains = True
            self.facts.trains = True
        if self._in_main and isinstance(node.func, cst.Name):
            self.facts.main_calls.add(node.func.value)
        if trains and self._depth == 0:
            if self._in_main:
                self.facts.main_guard_trains = True
            else:
                self.facts.module_level_trains = True


def _is_main_guard(node: cst.If) -> bool:
    test = node.test
    if not m.matches(test, m.Comparison(left=m.Name("__name__"), comparisons=[m.ComparisonTarget(m.Equal(), m.SimpleString())])):
        return False
    return test.comparisons[0].comparator.evaluated_value == "__main__"


def collect_facts(module: cst.Module) -> FileFacts:
    facts = FileFacts()
    MetadataWrapper(module, unsafe_skip_copy=True).visit(_FactsVisitor(facts))
    return facts
