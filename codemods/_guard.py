"""Shared machinery of the transforms that put statements behind ``if rank == 0:``.

Subclasses say which statement starts a guarded run (``starts``) and which
following statements belong to it (``continues``); this class finds the runs in
every block where guarding is safe and wraps each run in one
``if dist.get_rank() == 0:``.

Guarding is only safe where the process group is already up: inside functions of
the program's files, inside the entry's ``__main__`` block, and at module level of
a module-level script (the setup sits right after its imports).  Code that runs
at import time of another module is never guarded.  Statements already under a
main-process check are left alone, and nothing that may reach a collective (a
DDP forward, a call into user code) is ever put behind the check.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import libcst as cst

from . import _patterns as P
from ._base import FileRole, Transform


class MainProcessGuard(Transform):
    """Base: wrap runs of statements in ``if dist.get_rank() == 0:``."""

    @classmethod
    def applies_to(cls, role: FileRole) -> bool:
        return role.in_program and not role.already_distributed

    # -- what to guard (subclasses) ------------------------------------------
    def starts(self, stmt: cst.BaseStatement) -> Optional[str]:
        """Why ``stmt`` must run on the main process only, or None."""
        raise NotImplementedError

    def continues(self, stmt: cst.BaseStatement) -> bool:
        """Whether ``stmt`` joins the run that the previous statements started."""
        return self.starts(stmt) is not None

    def refuse(self, run: Sequence[cst.BaseStatement]) -> Optional[str]:
        """Why guarding ``run`` would break the script (then it is left as it is
        and reported), or None."""
        return None

    def split_write(
        self, original: cst.BaseStatement, updated: cst.BaseStatement
    ) -> Optional[Tuple[List[cst.BaseStatement], cst.BaseStatement, str]]:
        """A write whose arguments are computed in the call (``save_image(self.denorm(x),
        path)``), split: (what every rank computes first, the write to guard with the
        computed values' names, why) -- or None."""
        return None

    def after_run(self, run: Sequence[cst.BaseStatement]) -> List[cst.BaseStatement]:
        """Statements to put after a guarded run (e.g. a barrier)."""
        return []

    # -- where guarding is safe ----------------------------------------------
    def guardable_block(self, block: cst.CSTNode) -> bool:
        if isinstance(block, cst.Module):
            return self.role.is_entry and self.role.entry_kind == "module"
        for anc in self.ancestors(block):
            if isinstance(anc, (cst.FunctionDef, cst.Lambda)):
                return True
            if isinstance(anc, cst.ClassDef):
                return False
            if isinstance(anc, cst.If) and P.is_main_guard(anc) and self.parent(anc) is self.module:
                return self.role.is_entry
            if isinstance(anc, cst.Module):
                return self.role.is_entry and self.role.entry_kind == "module"
        return False

    # -- the rewrite ----------------------------------------------------------
    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        if not self.guardable_block(original_node):
            return updated_node
        body = self._guard_runs(original_node.body, updated_node.body, original_node)
        return updated_node.with_changes(body=body) if body is not None else updated_node

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if self.guardable_block(original_node):
            body = self._guard_runs(original_node.body, updated_node.body, original_node)
            if body is not None:
                updated_node = updated_node.with_changes(body=body)
        return super().leave_Module(original_node, updated_node)

    def _guard_runs(self, originals, updated, block) -> Optional[List[cst.BaseStatement]]:
        if self._under_check(block):
            return None
        if len(originals) != len(updated):
            # a statement below became several (a barrier inserted after a guarded
            # save): guard the statements that are still themselves, one for one
            return self._guard_aligned(originals, updated, block)
        out: List[cst.BaseStatement] = []
        index = 0
        changed = False
        while index < len(originals):
            split = self.split_write(originals[index], updated[index])
            if split is not None:
                computed, write, why = split
                out.extend(computed)
                out.append(self._wrap([write]))
                out.extend(self.after_run(originals[index:index + 1]))
                self.changed(originals[index], why)
                changed = True
                index += 1
                continue
            why = self.starts(originals[index])
            if why is None:
                out.append(updated[index])
                index += 1
                continue
            end = index + 1
            while end < len(originals) and self.continues(originals[end]):
                end += 1
            refused = self.refuse(originals[index:end])
            if refused is not None:
                self.manual(originals[index], refused)
                first = updated[index]
                markers = self.marker_lines(originals[index])
                out.append(first.with_changes(leading_lines=[*first.leading_lines, *markers]))
                out.extend(updated[index + 1 : end])
                changed = changed or bool(markers)
                index = end
                continue
            run = [self._unguard_inner(stmt) for stmt in updated[index:end]]
            after = self.after_run(originals[index:end])
            markers = self.marker_lines(originals[index])
            previous = out[-1] if out else None
            if self._joinable(previous) and not markers:
                # right after our own main-process block: one block, not two
                out[-1] = previous.with_changes(
                    body=previous.body.with_changes(body=[*previous.body.body, *run])
                )
            else:
                guarded = self._wrap(run)
                out.append(guarded.with_changes(leading_lines=[*guarded.leading_lines, *markers]))
            out.extend(after)
            self.changed(originals[index], why)
            changed = True
            index = end
        return self._merge_adjacent(out) if changed else None

    def _guard_aligned(self, originals, updated, block) -> Optional[List[cst.BaseStatement]]:
        """``_guard_runs`` where the block's statements no longer match one for one:
        the stretches whose code is unchanged are guarded as usual; what a statement
        became (several statements, or none) is kept as it is, between them."""
        import difflib

        before = [self.module.code_for_node(s) for s in originals]
        after = [self.module.code_for_node(s) for s in updated]
        out: List[cst.BaseStatement] = []
        changed = False
        matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag != "equal":
                out.extend(updated[j1:j2])
                continue
            stretch = self._guard_runs(originals[i1:i2], updated[j1:j2], block)
            changed = changed or stretch is not None
            out.extend(stretch if stretch is not None else updated[j1:j2])
        return self._merge_adjacent(out) if changed else None

    def _unguard_inner(self, stmt: cst.BaseStatement) -> cst.BaseStatement:
        """``if is_best:`` whose body this pass already guarded (blocks are left
        bottom-up): inside the run's own check, that inner check goes."""
        if not (isinstance(stmt, cst.If) and stmt.orelse is None and isinstance(stmt.body, cst.IndentedBlock)):
            return stmt
        body: List[cst.BaseStatement] = []
        for inner in stmt.body.body:
            if self._joinable(inner):
                moved = list(inner.body.body)
                moved[0] = moved[0].with_changes(leading_lines=[*inner.leading_lines, *moved[0].leading_lines])
                body.extend(moved)
            else:
                body.append(inner)
        return stmt.with_changes(body=stmt.body.with_changes(body=body))

    def _merge_adjacent(self, stmts: List[cst.BaseStatement]) -> List[cst.BaseStatement]:
        """Two main-process blocks in a row become one."""
        out: List[cst.BaseStatement] = []
        for stmt in stmts:
            previous = out[-1] if out else None
            if self._joinable(previous) and self._joinable(stmt):
                body = list(stmt.body.body)
                body[0] = body[0].with_changes(leading_lines=[*stmt.leading_lines, *body[0].leading_lines])
                out[-1] = previous.with_changes(
                    body=previous.body.with_changes(body=[*previous.body.body, *body])
                )
            else:
                out.append(stmt)
        return out

    def _under_check(self, block: cst.CSTNode) -> bool:
        child = block
        for anc in self.ancestors(block):
            if isinstance(anc, cst.If) and child is anc.body and P.is_main_process_check(self, anc.test):
                return True
            if isinstance(anc, cst.Else):
                parent_if = self.parent(anc)
                if isinstance(parent_if, cst.If) and P.is_rank_dependent(self, parent_if.test):
                    return True
            if isinstance(anc, (cst.FunctionDef, cst.ClassDef)):
                return False
            child = anc
        return False

    def _joinable(self, stmt) -> bool:
        if not isinstance(stmt, cst.If) or stmt.orelse is not None:
            return False
        test = self.module.code_for_node(stmt.test)
        return test == self.module.code_for_node(self.main_process_test())

    def _wrap(self, run: List[cst.BaseStatement]) -> cst.If:
        lead = run[0].leading_lines
        run = [run[0].with_changes(leading_lines=[]), *run[1:]]
        return cst.If(
            test=self.main_process_test(),
            body=cst.IndentedBlock(body=run),
            leading_lines=lead,
        )


def single_call(stmt: cst.CSTNode) -> Optional[cst.Call]:
    """The call of a one-call expression statement (``print(...)``), else None."""
    if (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.Expr)
        and isinstance(stmt.body[0].value, cst.Call)
    ):
        return stmt.body[0].value
    return None
