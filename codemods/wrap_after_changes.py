"""DDP202 wrap-after-changes: build the DDP wrap after the model's last change before training.

DataParallel copies the module on every forward pass, so a script could wrap
first and initialise, convert or extend the model afterwards.  DDP registers
the parameters and broadcasts rank 0's values when it is built: weights drawn
afterwards with each rank's own random numbers stay different, a layer added
afterwards gets no gradient averaging.  ssd.pytorch's shape::

    net = DistributedDataParallel(ssd_net.to(device), device_ids=...)  # (was DataParallel)
    if args.resume:
        ssd_net.load_weights(args.resume)
    if not args.resume:
        ssd_net.extras.apply(weights_init)
    optimizer = optim.SGD(net.parameters(), ...)

becomes::

    if args.resume:
        ssd_net.load_weights(args.resume)
    if not args.resume:
        ssd_net.extras.apply(weights_init)
    net = DistributedDataParallel(ssd_net.to(device), device_ids=...)
    optimizer = optim.SGD(net.parameters(), ...)

The decision is ``_analysis.changes_after_wrap`` (lint's DDP202) and where the
wrap may go, ``_analysis.wrap_destination``: within its block, past statements
that do not need the wrapper.  Where it may not move (a change made through
``model.module``, a ``requires_grad`` switch during training) the change is
reported, as lint reports it.  Runs on the wraps convert has just made (the
DataParallel ones and wrap-model's), not on a hand-written DDP script.
"""

from __future__ import annotations

import ast
from typing import Dict, List, Tuple

import libcst as cst

from . import _analysis as A
from . import _names as N
from ._base import FileRole, Transform


class WrapAfterChanges(Transform):
    CODE = "DDP202"
    NAME = "wrap-after-changes"
    DESCRIPTION = "Build the DDP wrap after the model's last change before training."
    TRIGGERS = ("DistributedDataParallel",)

    @classmethod
    def applies_to(cls, role: FileRole) -> bool:
        return role.in_program and not role.already_distributed

    def visit_Module(self, node: cst.Module) -> bool:
        src = self.ast_source
        by_wrap: Dict[int, List[Tuple[ast.stmt, str, str]]] = {}
        for stmt, wrap_line, name, what in A.changes_after_wrap(src, N.DDP):
            by_wrap.setdefault(wrap_line, []).append((stmt, name, what))
        assigns = {a.lineno: a for a in src.of_type(ast.Assign)}
        for wrap_line, changes in sorted(by_wrap.items()):
            assign = assigns.get(wrap_line)
            during_training = any(what.endswith("during training") for _, _, what in changes)
            after = None if assign is None or during_training else A.wrap_destination(
                src, assign, [stmt for stmt, _, _ in changes], N.DDP
            )
            wrap = self.statement_at(wrap_line)
            destination = self.statement_at(after.lineno) if after is not None else None
            if wrap is None or destination is None:
                self._report(changes)
                continue
            what = ", ".join(sorted({w for _, _, w in changes}))
            self.replace_statement(wrap, [])
            self.insert_after(destination, [wrap.with_changes(leading_lines=[
                line for line in wrap.leading_lines if line.comment is not None
            ])])
            self.changed(
                wrap,
                f"the DDP wrap is built after the changes to {changes[0][1]} ({what}), not before them: "
                "DDP copies rank 0's parameters to every rank when it is built, and DataParallel's "
                "wrap-first order would leave each rank its own weights",
            )
        return bool(by_wrap)  # (the moves and the markers are made when leaving the statements)

    def _report(self, changes: List[Tuple[ast.stmt, str, str]]) -> None:
        for stmt, name, what in changes:
            node = self.statement_at(stmt.lineno)
            if node is None:
                continue
            self.manual(
                node,
                f"{name} is changed after the DDP wrap ({what}): "
                + (
                    A.UNFREEZE_ADVICE if what.endswith("during training") else
                    "DDP registers the parameters and copies rank 0's values to all ranks when it "
                    "is built, so later changes are not synchronised (new layers get no gradient "
                    "averaging, re-initialised weights differ per rank); do this before the wrap"
                ),
            )
