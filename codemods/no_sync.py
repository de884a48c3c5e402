"""DDP203 no-sync-accumulation: skip the all-reduce on non-final micro-steps.

Under DDP every ``backward()`` all-reduces the gradients.  With gradient
accumulation only the micro-step that ends in ``optimizer.step()`` needs it; the
others should run forward and backward inside ``model.no_sync()`` (C3)::

    for step, (x, y) in enumerate(loader):
        loss = criterion(model(x), y) / accum
        loss.backward()
        if (step + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()

becomes::

    for step, (x, y) in enumerate(loader):
        with contextlib.nullcontext() if (step + 1) % accum == 0 else model.no_sync():
            loss = criterion(model(x), y) / accum
            loss.backward()
        if (step + 1) % accum == 0:
            ...

The gradients accumulated locally are averaged at the next synchronised
backward, so the result is the same as all-reducing every time, only faster.
The condition is reused as written; when it has side effects or depends on
values computed after the backward the loop is reported instead.
"""

from __future__ import annotations

import ast
from typing import List, Optional, Set

import libcst as cst
import libcst.matchers as m
from libcst.codemod.visitors import AddImportsVisitor

from . import _names as N
from . import _patterns as P
from ._base import FileRole, Transform

_MODEL_WORD = ("model", "net", "module", "ddp", "network", "classifier", "encoder")


class NoSyncAccumulation(Transform):
    CODE = "DDP203"
    NAME = "no-sync-accumulation"
    DESCRIPTION = "Run non-final gradient-accumulation micro-steps inside model.no_sync()."
    TRIGGERS = ("backward",)

    @classmethod
    def applies_to(cls, role: FileRole) -> bool:
        return role.in_program and not role.already_distributed

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        body = original_node.body
        if not isinstance(body, cst.IndentedBlock):
            return updated_node
        stmts = list(body.body)
        if any(_is_no_sync(s) for s in stmts):
            return updated_node
        backward = next((i for i, s in enumerate(stmts) if _is_backward(s)), None)
        if backward is None:
            return updated_node
        step_if = next(
            (i for i in range(backward + 1, len(stmts)) if isinstance(stmts[i], cst.If) and _steps(stmts[i].body)),
            None,
        )
        if step_if is not None and not self._accumulates(original_node):
            return updated_node  # (``if enc_opt is not None: enc_opt.step()``: a step every batch)
        if step_if is None:
            if not _steps(body) and self._step_follows(original_node):
                self.manual(
                    original_node,
                    "backward() on several micro-batches before one optimizer step: each backward "
                    "all-reduces; run all but the last inside model.no_sync()",
                )
            return updated_node
        condition = stmts[step_if].test
        model = self._model_called(stmts[: backward + 1])
        if model is None:
            self.manual(
                original_node,
                "gradient accumulation: could not tell which model to put in no_sync(); "
                "wrap the non-final micro-steps in model.no_sync() by hand",
            )
            return updated_node
        first = next(i for i, s in enumerate(stmts[: backward + 1]) if _calls(s, model))
        assigned = set()
        for s in stmts[first:step_if]:
            assigned |= _assigned(s)
        if not P.is_pure(condition) or assigned & set(P.names_in(condition)):
            self.manual(
                stmts[step_if],
                "gradient accumulation: the step condition cannot be evaluated before the "
                "forward; wrap the non-final micro-steps in model.no_sync() by hand",
            )
            return updated_node
        AddImportsVisitor.add_needed_import(self.context, "contextlib")
        cond_code = self.module.code_for_node(condition)
        if isinstance(condition, (cst.IfExp, cst.Lambda, cst.NamedExpr)):
            cond_code = f"({cond_code})"
        if not self.role.group_always_up:
            # (lint --fix on a script that wraps by hand: maybe only when launched
            # distributed -- ``if local_rank != -1: model = DDP(model)``)
            if isinstance(condition, cst.BooleanOperation):
                cond_code = f"({cond_code})"
            cond_code = f'{cond_code} or not hasattr({model}, "no_sync")'
        header = cst.parse_statement(
            f"with contextlib.nullcontext() if {cond_code} else {model}.no_sync():\n    pass\n"
        )
        assert isinstance(header, cst.With)
        new_stmts = list(updated_node.body.body)
        inner = new_stmts[first : backward + 1]
        lead = inner[0].leading_lines
        inner[0] = inner[0].with_changes(leading_lines=[])
        with_stmt = header.with_changes(
            body=header.body.with_changes(body=inner), leading_lines=lead
        )
        self.changed(
            original_node,
            f"gradient accumulation: non-final micro-steps run in {model}.no_sync() "
            "(no all-reduce until the optimizer step)",
        )
        return updated_node.with_changes(
            body=updated_node.body.with_changes(
                body=[*new_stmts[:first], with_stmt, *new_stmts[backward + 1 :]]
            )
        )

    def _accumulates(self, loop: cst.For) -> bool:
        """Lint's decision (``accumulation_without_no_sync.accumulates``) on the
        ``ast`` loop at the place of ``loop``."""
        from ._bridge import byte_offset
        from .rules.accumulation_without_no_sync import accumulates

        line, column = self.position(loop)
        src = self.ast_source
        offset = byte_offset(src.lines, line, column)
        found = next(
            (n for n in src.of_type(ast.For, ast.AsyncFor) if n.lineno == line and n.col_offset == offset), None
        )
        return found is None or accumulates(found)

    def _step_follows(self, loop: cst.For) -> bool:
        """An optimizer step right after ``loop`` in the same block: the loop
        accumulates gradients over its iterations (micro-batches of one batch)."""
        block = self.parent(loop)
        if not isinstance(block, cst.IndentedBlock):
            return False
        stmts = list(block.body)
        index = next((i for i, s in enumerate(stmts) if s is loop), None)
        return index is not None and any(_steps(s) for s in stmts[index + 1 :])

    def _model_called(self, stmts: List[cst.BaseStatement]) -> Optional[str]:
        """The module called on the batch before the backward (``model(x)``)."""
        found: List[str] = []
        for stmt in stmts:
            for call in P.find(stmt, cst.Call):
                name = P.dotted_name(call.func)
                last = name.rsplit(".", 1)[-1].lower()
                if name and any(word in last for word in _MODEL_WORD) and not self.qnames(call.func) & N.DDP:
                    found.append(name)
        unique = sorted(set(found))
        return unique[0] if len(unique) == 1 else None


def _is_backward(stmt: cst.CSTNode) -> bool:
    return m.matches(
        stmt,
        m.SimpleStatementLine(body=[m.Expr(value=m.Call(func=m.Attribute(attr=m.Name("backward"))))]),
    )


def _steps(block: cst.CSTNode) -> bool:
    for call in P.find(block, cst.Call):
        if m.matches(call.func, m.Attribute(attr=m.Name("step"))):
            name = P.dotted_name(call.func.value).lower()
            if "opt" in name or "scaler" in name:
                return True
    return False


def _is_no_sync(stmt: cst.CSTNode) -> bool:
    if not isinstance(stmt, cst.With):
        return False
    return any(P.calls_method(item.item, "no_sync") for item in stmt.items)


def _calls(stmt: cst.CSTNode, name: str) -> bool:
    return any(P.dotted_name(call.func) == name for call in P.find(stmt, cst.Call))


def _assigned(stmt: cst.CSTNode) -> Set[str]:
    names: Set[str] = set()
    for node in P.find(stmt, cst.AssignTarget, cst.AugAssign):
        names.update(P.target_names(node.target))
    return names
