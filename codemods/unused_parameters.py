"""DDP204 unused-parameters: a submodule that ``forward`` calls only under a condition, or never.

DataParallel does not mind parameters that get no gradient in a step.  DDP does:
its reducer waits for a gradient of every parameter, and the step after one in
which a submodule went unused stops with "Expected to have finished reduction in
the prior iteration before starting a new one".  A model whose ``forward`` calls
a layer only in one branch::

    def forward(self, x, use_aux=False):
        h = self.body(x)
        if use_aux:
            return self.head(h) + self.aux_head(h)
        return self.head(h)

gets a note at that call (and a layer that nothing in a training file uses at
all, one at its ``__init__`` line): if the branch can be skipped in a training step, pass
``find_unused_parameters=True`` to ``DistributedDataParallel`` (a graph walk per
step) or freeze the layer.  Nothing is rewritten: only the author knows whether
the branch is taken.  Layers without parameters (dropout, activations, pooling)
and ``if self.training:`` branches (always taken while training) are not noted.
"""

from __future__ import annotations

import ast
from typing import Iterator, List, Set, Tuple

import libcst as cst

from ._base import FileRole, Transform


class UnusedParameters(Transform):
    CODE = "DDP204"
    NAME = "unused-parameters"
    DESCRIPTION = "Note layers that forward() uses only under a condition (DDP needs find_unused_parameters)."
    TRIGGERS = ("def forward",)

    @classmethod
    def applies_to(cls, role: FileRole) -> bool:
        return role.in_program and not role.already_distributed

    def visit_Module(self, node: cst.Module) -> bool:
        tree, qualname = self.ast_source.tree, self.ast_source.qualname
        notes = [
            (call.lineno,
             f"{cls_name}.forward calls self.{attr} only under a condition: under DDP a training "
             f"step that skips it stops the next one (\"Expected to have finished reduction\"); "
             f"if it can be skipped, pass find_unused_parameters=True to DistributedDataParallel "
             f"(a graph walk per step) or freeze it")
            for cls_name, attr, call in conditional_layers(tree, qualname)
        ] + [
            (assign.lineno,
             f"{cls_name}.{attr} is built but nothing in this file uses it: under DDP its "
             f"parameters get no gradient and the second training step stops (\"Expected to "
             f"have finished reduction\"); delete it, freeze it before the wrap "
             f"(requires_grad_(False)), or pass find_unused_parameters=True to DistributedDataParallel")
            for cls_name, attr, assign in never_called_layers(tree, qualname)
        ]
        for line, message in notes:
            stmt = self.statement_at(line)
            if stmt is not None:
                self.note(stmt, message)
        return False  # notes only: no need to walk the tree


#: layers without parameters: a step that skips them leaves no gradient missing
_PARAMETER_FREE = frozenset({
    "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "Identity", "Flatten", "Unflatten",
    "ReLU", "ReLU6", "LeakyReLU", "GELU", "SiLU", "Mish", "ELU", "SELU", "CELU", "Sigmoid", "Tanh",
    "Hardswish", "Hardsigmoid", "Hardtanh", "Softmax", "LogSoftmax", "Softplus",
    "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d",
    "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d",
    "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AdaptiveMaxPool3d",
    "Upsample", "UpsamplingNearest2d", "UpsamplingBilinear2d", "PixelShuffle", "PixelUnshuffle",
})


def conditional_layers(tree: ast.Module, qualname=None) -> Iterator[Tuple[str, str, ast.Call]]:
    """(class, attribute, first call) for each layer of a class of the file that
    its ``forward`` calls, but not on every path through it (one branch of an
    ``if``, a conditional expression, the right of ``and``/``or``) -- a layer with
    parameters, built in ``__init__``."""
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        methods = {f.name: f for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
        forward, init = methods.get("forward"), methods.get("__init__")
        if forward is None or init is None:
            continue
        layers = _layers(init, qualname)
        always = _always(forward.body)
        seen: Set[str] = set()
        for call in _self_calls(forward):
            attr = call.func.attr  # type: ignore[attr-defined]
            if attr in layers and attr not in always and attr not in seen:
                seen.add(attr)
                yield cls.name, attr, call


def never_called_layers(tree: ast.Module, qualname=None) -> Iterator[Tuple[str, str, ast.Assign]]:
    """(class, attribute, assignment) for a layer with parameters that a class of
    the file builds in ``__init__`` (``self.old_fc = nn.Linear(...)``, kept so old
    checkpoints load) and that nothing in the file refers to again -- no
    ``.old_fc`` anywhere, no string of its name (``getattr(self, "old_fc")``), in
    a class whose methods do not walk their own modules (``self.children()``) --
    in a file that trains (where the model is used, as far as one file shows)."""
    attributes: dict = {}
    strings: Set[str] = set()
    nodes = list(ast.walk(tree))
    if not any(isinstance(n, ast.Attribute) and n.attr == "backward" for n in nodes):
        return  # the model trains in another module, which may use the layer
    if any(isinstance(n, ast.Attribute) and n.attr in ("requires_grad", "requires_grad_") for n in nodes):
        return  # the file freezes parameters itself (maybe these: a frozen layer is no unused one)
    if any(
        isinstance(n, ast.Call) and getattr(n.func, "id", "") in ("getattr", "setattr", "hasattr")
        and len(n.args) > 1 and not isinstance(n.args[1], ast.Constant)
        for n in nodes
    ):
        return  # layers reached by computed names (``getattr(m, "up" + k)``)
    built = {getattr(n.func, "id", "") for n in nodes if isinstance(n, ast.Call)}
    for node in nodes:
        if isinstance(node, ast.Attribute):
            attributes[node.attr] = attributes.get(node.attr, 0) + 1
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            strings.add(node.value)
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        methods = {f.name: f for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
        init = methods.get("__init__")
        if init is None or "forward" not in methods or _walks_own_modules(cls) or cls.name not in built:
            continue  # (a class the file does not build may be used elsewhere)
        if not all(dotted_base in ("nn.Module", "torch.nn.Module", "Module") for dotted_base in map(_dotted, cls.bases)):
            continue  # a subclass: its base's code (``super().forward``) may use the layer
        layers = _layers(init, qualname)
        for node in ast.walk(init):
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and _self_attribute(node.targets[0])):
                continue
            attr = node.targets[0].attr
            if attr in layers and attributes.get(attr) == 1 and attr not in strings:
                yield cls.name, attr, node


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def _walks_own_modules(cls: ast.ClassDef) -> bool:
    """``self.children()``, ``self.modules()``, ``getattr(self, ...)``, ``self._modules``,
    ``vars(self)``, ``self.__dict__``: a layer may be reached without its name."""
    for node in ast.walk(cls):
        if isinstance(node, ast.Attribute) and _self_attribute(node) and node.attr in (
            "children", "modules", "named_children", "named_modules", "_modules", "__dict__",
            "parameters", "named_parameters",
        ):
            return True
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("getattr", "vars") and node.args and (
            isinstance(node.args[0], ast.Name) and node.args[0].id == "self"
        ):
            return True
    return False


def _layers(init: ast.AST, qualname=None) -> Set[str]:
    """``self.x = nn.Linear(...)`` in ``__init__``: x, for a layer that may have parameters."""
    found = set()
    for node in ast.walk(init):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = node.value.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if not name or name in _PARAMETER_FREE or not name[:1].isupper():
                continue  # a function's result (a tensor, a list): not a layer
            if name.endswith("Loss") and name != "AdaptiveLogSoftmaxWithLoss" and (
                qualname is None or qualname(func).startswith("torch.")
            ):
                continue  # nn.CrossEntropyLoss(): no parameters (a project's CenterLoss may have some)
            for target in node.targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                    found.add(target.attr)
    return found


def _self_attribute(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"


def _self_call(node: ast.AST) -> str:
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
            return func.attr
    return ""


def _self_calls(forward: ast.AST) -> List[ast.Call]:
    calls = [n for n in ast.walk(forward) if _self_call(n)]
    return sorted(calls, key=lambda c: (c.lineno, c.col_offset))


def _always(body) -> Set[str]:
    """The layers (``self.x(...)``) called on every path through these statements
    (loops count as run; an early ``return`` is not followed)."""
    found: Set[str] = set()
    for stmt in body if isinstance(body, list) else [body]:
        found |= _always_in(stmt)
    return found


def _always_in(node: ast.AST) -> Set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
        return set()  # a nested function runs who knows when
    if isinstance(node, (ast.If, ast.IfExp)):
        training = _training_test(node.test)
        body, orelse = _always(node.body), _always(node.orelse) if node.orelse else set()
        taken = body if training is True else orelse if training is False else body & orelse
        # ``if self.downsample is not None: self.downsample(x)``: the layer is absent or used
        tested = {n.attr for n in ast.walk(node.test) if _self_attribute(n)}
        return _always_in(node.test) | taken | ((body | orelse) & tested)
    if isinstance(node, ast.BoolOp):
        return _always_in(node.values[0])
    found = {_self_call(node)} - {""}
    for child in ast.iter_child_nodes(node):
        found |= _always_in(child)
    return found


def _training_test(test: ast.AST):
    """True for ``self.training`` (its body always runs in a training step), False
    for ``not self.training`` (its ``else`` always runs), None otherwise."""
    if isinstance(test, ast.Attribute) and test.attr == "training" and isinstance(test.value, ast.Name) and test.value.id == "self":
        return True
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _training_test(test.operand)
        return None if inner is None else not inner
    return None
