"""DDP107 random-split: the same train/validation split on every process.

``random_split`` draws from torch's default generator, and each DDP process has
its own: unless the script seeds them all alike first, every process splits the
dataset differently.  The DistributedSampler then shards a different training
set on each rank -- the shards overlap, and a rank trains on samples another
rank validates on -- with no error.  The split gets a generator of its own, with
a fixed seed, so that every process draws the same one::

    train_set, val_set = random_split(dataset, [80, 20])

becomes::

    train_set, val_set = random_split(dataset, [80, 20], generator=torch.Generator().manual_seed(0))

A script that seeds torch alike on every process before (``torch.manual_seed(0)``,
``seed_everything(seed)``) is left as it is; one that seeds by rank is not.
"""

from __future__ import annotations

from typing import Set

import libcst as cst

from . import _analysis as A
from ._base import FileRole, Transform


class RandomSplit(Transform):
    CODE = "DDP107"
    NAME = "random-split"
    DESCRIPTION = "Give random_split a seeded generator: the same split on every process."
    TRIGGERS = ("random_split",)

    @classmethod
    def applies_to(cls, role: FileRole) -> bool:
        return role.in_program and not role.already_distributed

    def visit_Module(self, node: cst.Module) -> bool:
        self._lines: Set[tuple] = {
            (c.lineno, c.col_offset + 1) for c in A.unseeded_random_splits(self.ast_source, with_kwargs=True)
        }
        return bool(self._lines)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self.position(original_node) not in self._lines:
            return updated_node
        code = self.module.code_for_node(original_node)
        if any(a.star for a in original_node.args) or "\n" in code or "#" in code:
            # (``*args``/``**kwargs`` may hold a generator; a call over several lines keeps its layout)
            self.manual(
                original_node,
                "random_split without a generator: each process draws its own split; add "
                f"generator={self.torch()}.Generator().manual_seed(0) to this call, unless its "
                "*args/**kwargs hold one (left as written: its arguments, or its lines and comments)",
            )
            return updated_node
        generator = cst.parse_expression(f"{self.torch()}.Generator().manual_seed(0)")
        last = updated_node.args[-1]
        args = [*updated_node.args[:-1], last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))]
        args.append(cst.Arg(value=generator, keyword=cst.Name("generator"), equal=cst.AssignEqual(
            whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
        )))
        self.changed(
            original_node,
            "random_split draws from a generator of its own with a fixed seed: every process splits "
            "the data alike (unseeded, each rank split it differently, and one trained on what another validates on)",
        )
        return updated_node.with_changes(args=args)
