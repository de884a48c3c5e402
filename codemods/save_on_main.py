"""DDP302 save-on-main: write checkpoints from the main process only.

Every DDP process holds the same weights; if all of them ``torch.save`` to the
same path they race and can leave a corrupt file (D2).  The save, and the file
operations right after it that handle the same checkpoint (``shutil.copyfile``
to ``model_best``, ``os.replace``...), go behind one main-process check::

    torch.save(state, path)
    if is_best:
        shutil.copyfile(path, "model_best.pth")

becomes::

    if dist.get_rank() == 0:
        torch.save(state, path)
        if is_best:
            shutil.copyfile(path, "model_best.pth")

When the script reads that path back later (``torch.load`` of the same path
expression) a ``dist.barrier()`` follows, so that no rank reads a file that rank 0
is still writing -- but only where every rank reaches that spot (not inside a
condition); elsewhere the spot is reported.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Set

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ScopeProvider

from . import _names as N
from . import _patterns as P
from ._guard import MainProcessGuard, single_call

_FILE_OPS = frozenset(
    {
        "shutil.copyfile",
        "shutil.copy",
        "shutil.copy2",
        "shutil.move",
        "os.replace",
        "os.rename",
        "os.remove",
        "os.unlink",
        "os.symlink",
    }
)


class SaveOnMainProcess(MainProcessGuard):
    CODE = "DDP302"
    NAME = "save-on-main"
    DESCRIPTION = "Guard torch.save (and the file operations after it) with a main-process check."

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._loaded_paths: Optional[Set[str]] = None

    def starts(self, stmt: cst.BaseStatement) -> Optional[str]:
        call = single_call(stmt)
        if call is not None and self.is_call(call, N.TORCH_SAVE):
            owner = self.parent(self.parent(stmt))
            if isinstance(owner, cst.With) and self._with_open_save(owner):
                return None  # the whole `with open(...)` is guarded instead
            return "torch.save runs on the main process only (every rank holds the same weights)"
        if isinstance(stmt, cst.With) and self._with_open_save(stmt):
            return "the checkpoint file is written by the main process only"
        return None

    def continues(self, stmt: cst.BaseStatement) -> bool:
        if self.starts(stmt) is not None:
            return True
        call = single_call(stmt)
        if call is not None:
            return self.is_call(call, _FILE_OPS)
        if isinstance(stmt, cst.If) and stmt.orelse is None:
            body = stmt.body.body
            return (
                P.is_pure(stmt.test)
                and any(self.continues(s) for s in body)
                and all(self.continues(s) or self._local_assignment(s, stmt) for s in body)
            )
        return False

    def _local_assignment(self, stmt: cst.BaseStatement, block_owner: cst.If) -> bool:
        """``best_path = os.path.join(...)``: pure, and used only inside ``block_owner``."""
        if not m.matches(stmt, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name())])])):
            return False
        assign = stmt.body[0]
        if not P.is_pure(assign.value):
            return False
        name = assign.targets[0].target
        scope = self.get_metadata(ScopeProvider, name, None)
        if scope is None:
            return False
        for access in scope.accesses[name.value]:
            if not any(anc is block_owner for anc in self.ancestors(access.node)):
                return False
        return True

    def _with_open_save(self, stmt: cst.With) -> bool:
        opens = all(
            m.matches(item.item, m.Call(func=m.Name("open"))) for item in stmt.items
        )
        body = stmt.body.body if isinstance(stmt.body, cst.IndentedBlock) else []
        return opens and bool(body) and all(
            (c := single_call(s)) is not None and self.is_call(c, N.TORCH_SAVE) for s in body
        )

    def visit_Call(self, node: cst.Call) -> None:
        # a torch.save that is not a statement of its own (in an expression, a lambda)
        if self.is_call(node, N.TORCH_SAVE):
            parent = self.parent(node)
            if not isinstance(parent, cst.Expr) and not P.under_main_process_check(self, node):
                self.manual(node, "torch.save inside an expression: make sure only rank 0 writes")

    def after_run(self, run: Sequence[cst.BaseStatement]) -> List[cst.BaseStatement]:
        paths = {self._save_path(s) for s in run} - {None}
        if not paths & self._paths_loaded():
            return []
        first = run[0]
        if self._conditional(first):
            self.manual(
                first,
                "other ranks read this checkpoint later: add dist.barrier() after the save "
                "where every rank reaches it",
            )
            return []
        self.changed(first, "dist.barrier() after the save: other ranks read the file later")
        return [cst.parse_statement(f"{self.dist()}.barrier()")]

    def _save_path(self, stmt: cst.BaseStatement) -> Optional[str]:
        call = single_call(stmt)
        if call is not None and self.is_call(call, N.TORCH_SAVE) and len(call.args) >= 2:
            return self.module.code_for_node(call.args[1].value)
        return None

    def _paths_loaded(self) -> Set[str]:
        if self._loaded_paths is None:
            found: Set[str] = set()
            outer = self

            class Loads(cst.CSTVisitor):
                def visit_Call(self, call: cst.Call) -> None:
                    if outer.is_call(call, N.TORCH_LOAD) and call.args:
                        found.add(outer.module.code_for_node(call.args[0].value))

            self.module.visit(Loads())
            self._loaded_paths = found
        return self._loaded_paths

    def _conditional(self, stmt: cst.CSTNode) -> bool:
        """Inside an if/while/try of its function: maybe not every rank gets here."""
        for anc in self.ancestors(stmt):
            if isinstance(anc, (cst.FunctionDef, cst.Module)):
                return False
            if isinstance(anc, (cst.If, cst.While, cst.Try, cst.With)):
                return True
        return False
