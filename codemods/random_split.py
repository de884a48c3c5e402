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

A split made by hand -- ``indices = torch.randperm(len(dataset))`` for a ``Subset``
or a ``SubsetRandomSampler`` -- gets the same generator; one drawn with numpy or
``random`` is reported.

A hyper-parameter drawn from Python's or NumPy's random state while the run is
set up (``lr = random.random() * 5e-4`` in ``main``) differs per process (lint's
DDP108): every rank takes the main process's draw instead, once the process group
is up there::

    lr = main_process_value(random.random() * 5e-4)

(``main_process_value`` broadcasts the value from rank 0, added once per file).  A
draw made before the process group starts, or under a condition on the rank (the
broadcast is a collective), is reported.

A script that seeds torch alike on every process before (``torch.manual_seed(0)``,
``seed_everything(seed)``) is left as it is; one that seeds by rank is not.
"""

from __future__ import annotations

from typing import Dict, Set

import libcst as cst

from . import _analysis as A
from . import _patterns as P
from ._base import FileRole, Transform
from ._bridge import cst_position
from .rules.hyperparameters_drawn_per_rank import HyperparametersDrawnPerRank, drawn_per_rank, shareable_draws


#: every rank takes the main process's value (DDP108's fix)
SAME_ON_EVERY_RANK = '''
def {name}(value):
    """The main process's value, on every process (added by dp2ddp).

    A value drawn from Python's or NumPy's own random state differs per process;
    each rank takes rank 0's, so that they train alike.
    """
    shared = [value]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]
'''


class RandomSplit(Transform):
    CODE = "DDP107"
    NAME = "random-split"
    DESCRIPTION = "Give random_split a seeded generator: the same split on every process."
    TRIGGERS = ("random_split", "Subset", "random", "set(")

    @classmethod
    def applies_to(cls, role: FileRole) -> bool:
        return role.in_program and not role.already_distributed

    def visit_Module(self, node: cst.Module) -> bool:
        lines = self.ast_source.lines
        self._lines: Set[tuple] = {
            cst_position(lines, c) for c in A.unseeded_random_splits(self.ast_source, with_kwargs=True)
        }
        self._draws: Set[tuple] = {cst_position(lines, c) for c in A.unseeded_index_splits(self.ast_source)}
        # hyper-parameters drawn per process (lint's DDP108 decision): the main process's
        # value on every rank where the fix can share it, reported elsewhere
        self._per_rank = {cst_position(lines, c): message for c, message in drawn_per_rank(self.ast_source)}
        #: position of a shareable assignment's value -> the positions of its draws
        self._shareable: Dict[tuple, Set[tuple]] = {
            cst_position(lines, stmt.value): {cst_position(lines, c) for c in calls}
            for stmt, calls in shareable_draws(self.ast_source)
        }
        self._shared_draws: Set[tuple] = set()
        return bool(self._lines or self._draws or self._per_rank)

    def visit_Assign(self, node: cst.Assign) -> None:
        draws = self._shareable.get(self.position(node.value))
        if draws is not None and self.before_process_group(node) is None:
            self._shared_draws |= draws

    def visit_Call(self, node: cst.Call) -> None:
        message = self._per_rank.get(self.position(node))
        if message is not None and self.position(node) not in self._shared_draws:
            self.manual(node, message, code=HyperparametersDrawnPerRank.CODE)

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        draws = self._shareable.get(self.position(original_node.value))
        if draws is None or not draws <= self._shared_draws:
            return updated_node
        targets = ", ".join(P.dotted_name(t.target) or "it" for t in original_node.targets)
        self.changed(
            original_node,
            f"{targets} is drawn from this process's own random state: every rank now takes the main "
            "process's draw (drawn per rank, a learning rate differed between the copies, or a number "
            "of epochs left ranks waiting for each other)",
            code=HyperparametersDrawnPerRank.CODE,
        )
        helper = self.helper("main_process_value", SAME_ON_EVERY_RANK.replace("dist.", f"{self.dist()}.").lstrip("\n"))
        return updated_node.with_changes(value=cst.Call(func=cst.Name(helper), args=[cst.Arg(updated_node.value)]))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self.position(original_node) in self._draws and self.qnames(original_node.func) & A.INDEX_DRAWS.keys():
            return self._index_draw(original_node, updated_node)  # (not the .tolist() around it)
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
        self.changed(
            original_node,
            "random_split draws from a generator of its own with a fixed seed: every process splits "
            "the data alike (unseeded, each rank split it differently, and one trained on what another validates on)",
        )
        return self._with_generator(updated_node)

    def _with_generator(self, call: cst.Call) -> cst.Call:
        """``call`` with ``generator=torch.Generator().manual_seed(0)`` added last."""
        generator = cst.parse_expression(f"{self.torch()}.Generator().manual_seed(0)")
        last = call.args[-1]
        args = [*call.args[:-1], last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))]
        args.append(P.keyword_arg("generator", generator))
        return call.with_changes(args=args)

    def _index_draw(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        """``indices = torch.randperm(len(ds))`` for a ``Subset`` split: a generator of its
        own, like random_split's; numpy's and ``random``'s draws are reported."""
        torch_draw = any(q == "torch.randperm" for q in self.qnames(original.func))
        code = self.module.code_for_node(original)
        if not torch_draw or any(a.star for a in original.args) or "\n" in code or "#" in code:
            self.manual(
                original,
                f"the indices of a Subset split are drawn from each process's own random state "
                f"({code.split('(')[0]}): every rank splits differently, and one trains on what another "
                "validates on; draw them with a fixed seed (torch.randperm(n, generator="
                "torch.Generator().manual_seed(0)), np.random.default_rng(0).permutation(n)) "
                "or seed numpy/random alike on every process first",
            )
            return updated
        self.changed(
            original,
            "the indices of the Subset split are drawn from a generator of their own with a fixed seed: "
            "every process splits the data alike (unseeded, each rank split it differently)",
        )
        return self._with_generator(updated)
