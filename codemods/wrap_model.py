"""DDP009 wrap-model: wrap a single-device script's model in DistributedDataParallel.

A script with no DataParallel trains one model on one device.  Under torchrun it
must wrap that model in DDP, or every process trains its own copy and their
gradients are never averaged.  The model is the module whose parameters the
optimizer trains; the wrap goes right before the optimizer is built::

    model = Net().to(device)
    optimizer = optim.Adam(model.parameters(), lr=args.lr)

becomes::

    model = Net().to(device)
    model = DistributedDataParallel(
        model, device_ids=[local_rank] if torch.cuda.is_available() else None
    )
    optimizer = optim.Adam(model.parameters(), lr=args.lr)

(the module is moved to the device first when it was not already).  Code that
used the bare model afterwards is kept working by ``module-access`` (DDP303).
An optimizer built from something other than ``<module>.parameters()`` is
reported, and so is a program that trains without a torch.optim optimizer (its
first ``backward()``): there is no module to tell.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set

import libcst as cst
import libcst.matchers as m

from . import _analysis as A
from . import _names as N
from . import _patterns as P
from ._base import FileRole, Transform


class WrapModel(Transform):
    CODE = "DDP009"
    NAME = "wrap-model"
    DESCRIPTION = "Wrap the model that the optimizer trains in DistributedDataParallel."
    TRIGGERS = ("optim", "backward")

    @classmethod
    def applies_to(cls, role: FileRole) -> bool:
        return role.single_device and role.in_program and not role.already_distributed

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        #: (function, model) -> the statements before which it was wrapped
        self._wrapped: Dict[tuple, List[cst.CSTNode]] = {}
        self._by_hand_noted = False  # (a program without an optimizer: said once)

    def visit_Call(self, node: cst.Call) -> None:
        if self.role.no_optimizer and not self._by_hand_noted and m.matches(
            node.func, m.Attribute(attr=m.Name("backward"))
        ):
            # (pytorch/examples' word_language_model: ``p.data.add_(p.grad, alpha=-lr)``)
            self._by_hand_noted = True
            self.manual(
                node,
                "this program builds no torch.optim optimizer (one from another library, or "
                "parameters updated by hand), so no model was found to wrap in DistributedDataParallel: wrap the trained "
                "module by hand (model = DistributedDataParallel(model, device_ids=[local_rank] if "
                "torch.cuda.is_available() else None)), or every process trains a copy of its own",
            )
            return
        if self._optimizer_method_call(node):
            return
        if not any(N.is_optimizer(n) for n in self.qnames(node.func)):
            return
        model = self._trained_module(node)
        if model == "self" and self._in_optimizer_method(node):
            return  # (``def configure_optimizers(self, cfg): return AdamW(...)``: wrapped at the callers)
        if not model:
            self.manual(
                node,
                "could not tell which module this optimizer trains: wrap that module in "
                "DistributedDataParallel by hand",
            )
            return
        if model == "self":
            # ``self.opt = Adam(self.parameters())`` in a module's own __init__: a module
            # cannot wrap itself (``self = DDP(self)`` only rebinds a local)
            self.manual(
                node,
                "this module builds its own optimizer over self.parameters() (it trains itself): "
                "DistributedDataParallel must wrap it from outside, and its training step must "
                "call the wrapper (a self(x) or self.forward(x) inside it bypasses DDP's gradient "
                "sync); restructure it by hand",
            )
            return
        owner = self.enclosing_function(node)
        index = _parameter_index(owner, model)
        if index is not None and not _trains_here(owner):
            # ``def define_optimizer(m): return Adam(m.parameters())``: a DDP wrap of ``m``
            # there would be a local the training loop (elsewhere) never sees -- wrap at the callers
            self._wrap_at_callers(owner, index, model, node)
            return
        self._wrap_before_statement(model, node)

    def _trained_module(self, optimizer: cst.Call) -> str:
        """The module an optimizer trains (``_analysis.optimized_models``, lint's decision):
        ``model`` of ``model.parameters()``, the common root of parameter groups
        (``model.fc``, ``model.backbone``: ``model``; ``self.net``), "" when unknown."""
        call = self.ast_call(optimizer)
        names = A.optimized_models(self.ast_source, call) if call is not None else []
        roots = {n if len(names) == 1 else _root(n) for n in names}
        return roots.pop() if len(roots) == 1 else ""

    def _in_optimizer_method(self, node: cst.CSTNode) -> bool:
        func = self.enclosing_function(node)
        return func is not None and func.name.value in A.optimizer_methods(self.ast_source)

    def _optimizer_method_call(self, node: cst.Call) -> bool:
        """``optimizer = model.configure_optimizers(cfg)``, a method of the program's that
        returns an optimizer over its own module (``FileRole.program_optimizer_methods``):
        ``model`` is wrapped before the call -- where the function trains it or keeps it
        on ``self`` (the training loop then sees the wrapper); reported elsewhere."""
        func = node.func
        if not isinstance(func, cst.Attribute) or func.attr.value not in (
            set(self.role.program_optimizer_methods) | A.optimizer_methods(self.ast_source)
        ):
            return False
        model = P.dotted_name(func.value)
        head = model.split(".")[0]
        if not model or head in self.ast_source.aliases or head[:1].isupper():
            return False  # (solver.build_optimizer(model) of an imported module, a class's: not a model's own)
        if model.endswith(".module"):
            return True  # (model.module.configure_optimizers: wrapped already)
        if model == "self":
            self.manual(
                node,
                f"this module builds its own optimizer (self.{func.attr.value}()) and trains itself: "
                "DistributedDataParallel must wrap it from outside, and its training step must call the "
                "wrapper (a self(x) or self.forward(x) inside it bypasses DDP's gradient sync); "
                "restructure it by hand",
            )
            return True
        owner = self.enclosing_function(node)
        if model.startswith("self.") or owner is None or _trains_here(owner):
            self._wrap_before_statement(model, node)
        else:
            self.manual(
                node,
                f"{func.attr.value}() builds the optimizer of {model}: wrap {model} in "
                "DistributedDataParallel by hand where the training loop uses it",
            )
        return True

    def _wrap_at_callers(self, helper: cst.FunctionDef, index: int, parameter: str, node: cst.Call) -> None:
        name = helper.name.value
        calls = [
            c for c in self.module_calls
            if m.matches(c.func, m.Name(name)) and self.enclosing_function(c) is not helper
        ]
        passed = [_argument(c, index, parameter) for c in calls]
        if not calls or any(a is None or not P.dotted_name(a) for a in passed):
            self.manual(
                node,
                f"this optimizer is built in {name}() from its argument {parameter}: wrap the module "
                f"passed to {name}() in DistributedDataParallel before the call, by hand (where the "
                "training loop uses it)",
            )
            return
        for call, argument in zip(calls, passed):
            self._wrap_before_statement(P.dotted_name(argument), call)

    def _wrap_before_statement(self, model: str, node: cst.Call) -> None:
        """``model = DistributedDataParallel(...)`` before the statement of ``node``."""
        stmt = self.statement_of(node)
        if not isinstance(stmt, cst.SimpleStatementLine) or not isinstance(
            self.parent(stmt), (cst.IndentedBlock, cst.Module)
        ):
            self.manual(node, f"wrap {model} in DistributedDataParallel before its optimizer is built")
            return
        owner = self.enclosing_function(node)
        stmt = self._outside_optional_branches(stmt, model)
        key = (owner, model)
        if self._is_ddp(model, node):
            return
        if key in self._wrapped:
            # wrapped already -- unless on the other side of an if/else, which this
            # path never went through (a test-mode branch that builds an optimizer too)
            if not all(self._exclusive(stmt, earlier) for earlier in self._wrapped[key]):
                return
        self._wrapped.setdefault(key, []).append(stmt)
        references = list(A.bare_data_parallel_references(self.ast_source))
        if references:
            self.manual(
                node,
                f"{model} may be wrapped in DataParallel through a name (this file names "
                "DataParallel without calling it): DDP around it would nest two wrappers; wrap "
                "the model in DistributedDataParallel by hand, in place of that DataParallel",
            )
            return
        wrapper = self._data_parallel_like(model, node)
        if wrapper is not None:
            self.manual(
                node,
                f"{model} is wrapped by {wrapper}, a DataParallel variant: replace that wrapper "
                "with DistributedDataParallel by hand (DDP around it would nest two wrappers)",
            )
            return
        target = cst.parse_expression(model)
        moved = self.already_moved(target, node)
        device = None if moved else self.rank_name(node, "device")  # only when it is used
        # local_rank only once the device is settled: no preamble for a refused wrap
        local_rank = self.rank_name(node, "local_rank") if moved or device is not None else None
        if local_rank is None:
            self.manual(node, f"wrap {model} in DistributedDataParallel by hand")
            return
        module_code = model if moved else f"{model}.to({device})"
        ddp = self.object_alias("torch.nn.parallel", "DistributedDataParallel", N.DDP)
        module_code = self.module.code_for_node(self.ddp_module(cst.parse_expression(module_code), node))
        unused = ""
        dropped = A.discarded_outputs(self.ast_source, model)
        if dropped:
            unused = ", find_unused_parameters=True"
            self.note(
                node,
                f"{model} gets find_unused_parameters=True: a training step drops some of its outputs "
                f"(line {dropped[0].lineno}), so the layers behind them get no gradient there, and DDP "
                "would stop at the next step (\"Expected to have finished reduction\")",
            )
        dropped_inputs = [] if dropped else A.inputs_dropped_in_training(
            self.ast_source, model, forward_elsewhere=self.role.program_forward_tests_none
        )
        if dropped_inputs:
            unused = ", find_unused_parameters=True"
            self.note(node, A.dropped_inputs_note(model, dropped_inputs[0]), code="DDP204")
        wrap = cst.parse_statement(
            f"{model} = {ddp}({module_code}, device_ids=[{local_rank}] if "
            f"{self.torch()}.cuda.is_available() else None{unused})"
        )
        unwrap = []
        line = self.position(node)[0]
        if any(
            self.is_call(a.value, N.TORCH_LOAD) and self.position(a)[0] < line for a in self.assignments_to(model, node)
        ):
            # a whole model loaded back may be an old DataParallel pickle: DDP around it
            # would nest two wrappers
            unwrap = [cst.parse_statement(f'{model} = getattr({model}, "module", {model})  # (a DataParallel pickle)\n')]
            self.changed(node, f"{model} is loaded whole: an old DataParallel pickle is unwrapped before the DDP wrap")
        self.insert_before(stmt, [*unwrap, wrap])
        self.changed(node, f"{model} is wrapped in DistributedDataParallel before its optimizer is built")

    def _outside_optional_branches(self, stmt: cst.CSTNode, model: str) -> cst.CSTNode:
        """The statement before which to wrap ``model`` for an optimizer built at
        ``stmt``: ``stmt`` -- or, when the optimizer is built under an ``if`` that the
        model was bound before (``if args.use_optimizer: optimizer = SGD(...)``, an
        optimizer only on one path), that ``if``: every path then trains the DDP model,
        as the code after it (``model.module...``) expects."""
        assigned = self.assignments_to(model, stmt)
        anchor = stmt
        for anc in self.ancestors(stmt):
            if not isinstance(anc, (cst.If, cst.IndentedBlock, cst.Else)):
                break
            if isinstance(anc, cst.If):
                if P.is_main_guard(anc) or any(any(a is anc for a in self.ancestors(b)) for b in assigned):
                    break  # (bound in the branch: a resume if/else)
                anchor = anc
        if anchor is stmt or not isinstance(self.parent(anchor), (cst.IndentedBlock, cst.Module)):
            return stmt
        return stmt if self.before_process_group(anchor) is not None else anchor

    def _exclusive(self, one: cst.CSTNode, other: cst.CSTNode) -> bool:
        """``one`` and ``other`` lie on the two sides of one if/else: no run reaches both."""
        above_other = list(self.ancestors(other))
        child = one
        for anc in self.ancestors(one):
            if isinstance(anc, cst.If) and anc in above_other:
                sides = (anc.body, anc.orelse)
                mine = next((s for s in sides if s is child), None)
                theirs = next((s for s in sides if s is not None and any(a is s for a in above_other)), None)
                return mine is not None and theirs is not None and mine is not theirs
            if isinstance(anc, (cst.FunctionDef, cst.Module)):
                return False
            child = anc
        return False

    def _data_parallel_like(self, model: str, at: cst.CSTNode) -> Optional[str]:
        """The class ``model`` was built with when that is a DataParallel subclass of
        this file or, from elsewhere, a class named like one
        (``DataParallelWithCallback`` of the synchronized-BatchNorm package)."""
        if getattr(self, "_dp_classes", None) is None:
            self._dp_classes = {
                c.name.value
                for c in P.find(self.module, cst.ClassDef)
                if any(self.is_ref(b.value, N.DATA_PARALLEL) for b in c.bases)
            }
        for assign in self.assignments_to(model, at):
            value = assign.value
            while m.matches(value, P.DEVICE_MOVE):
                value = value.func.value
            if not isinstance(value, cst.Call):
                continue
            name = P.dotted_name(value.func)
            short = name.rsplit(".", 1)[-1]
            if short in self._dp_classes or "DataParallel" in short:
                return name
        return None

    def _is_ddp(self, model: str, at: cst.CSTNode) -> bool:
        """``model`` was assigned from a DDP call before ``at`` (converted already)."""
        line = self.position(at)[0]
        return any(
            self.is_call(assign.value, N.DDP) and self.position(assign)[0] < line
            for assign in self.assignments_to(model, at)
        )


def _trains_here(func: cst.FunctionDef) -> bool:
    """``func`` runs a training step itself (a ``backward()``): a wrap of its
    parameter there is the model its loop uses."""
    return any(m.matches(c.func, m.Attribute(attr=m.Name("backward"))) for c in P.find(func, cst.Call))


def _parameter_index(func: Optional[cst.FunctionDef], name: str) -> Optional[int]:
    """The position of ``name`` among ``func``'s parameters (``m`` of ``def
    define_optimizer(m)``), None if it is not one (or ``func`` is a method)."""
    if func is None or "." in name:
        return None
    params = [p.name.value for p in func.params.params]
    if params[:1] == ["self"] or name not in params:
        return None
    return params.index(name)


def _argument(call: cst.Call, index: int, name: str) -> Optional[cst.BaseExpression]:
    """What ``call`` passes for the parameter at ``index`` named ``name``."""
    for position, arg in enumerate(call.args):
        if arg.star:
            return None
        if arg.keyword is not None:
            if arg.keyword.value == name:
                return arg.value
        elif position == index:
            return arg.value
    return None


def _root(name: str) -> str:
    """The model a parameter group belongs to: ``model`` of ``model.fc``, ``self.net``
    of ``self.net.head``."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "self" and len(parts) > 1 else parts[0]
