"""DDP303 module-access: reach the bare model through ``.module`` after wrapping it.

``DistributedDataParallel`` forwards calls, ``train()``/``eval()``,
``parameters()`` and the other ``nn.Module`` machinery, but not the model's own
attributes, and its ``state_dict()`` keys carry a ``module.`` prefix (D3).  When
dp2ddp wraps a single-device script's model, the code after the wrap that used
the bare model goes through ``.module`` so that it keeps working and its
checkpoints keep their key format::

    torch.save(model.state_dict(), "model.pt")      # keys: "fc.weight"
    model.load_state_dict(torch.load("model.pt"))
    features = model.encoder(x)

becomes::

    torch.save(model.module.state_dict(), "model.pt")   # keys: "fc.weight"
    model.module.load_state_dict(torch.load("model.pt"))
    features = model.module.encoder(x)

This follows the wrapped model into the functions of the same file it is passed to.
A DataParallel script needs none of it: DP already had ``.module`` and the
``module.`` prefix, and DDP keeps both.
"""

from __future__ import annotations

import ast
import re
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst
import libcst.matchers as m

from . import _analysis as A
from . import _names as N
from . import _patterns as P
from ._base import FileRole, Transform
from ._facts import KEYWORDS_LOADED
from ._model import ModelAttributeFunction
from .dp_to_ddp import _loaded_back_message
from .sampler import _calls_backward

#: What DDP provides itself: no ``.module`` needed.
DDP_API = N.DDP_FORWARDS


#: methods of a model that run no forward pass (HF's save_pretrained, get_input_embeddings...)

#: functions of other modules that save what they get (``save_checkpoint(model, path)``)
_SAVER = re.compile(r"(?i)(^|_)(save|checkpoint|export)")
#: classes of another module whose objects may save the model handed to them
_SAVING_CLASS = re.compile(r"(?i)save|checkpoint|export|early_?stop")

#: builtins that take a module as a container of its layers
_CONTAINER_BUILTINS = frozenset({"enumerate", "len", "list", "iter", "reversed", "tuple", "zip"})


class ModuleAccess(Transform):
    CODE = "DDP303"
    NAME = "module-access"
    DESCRIPTION = "Use model.module for state_dict and the model's own attributes after wrapping."
    TRIGGERS = ("DistributedDataParallel",)

    @classmethod
    def applies_to(cls, role: FileRole) -> bool:
        return role.single_device and role.in_program and not role.already_distributed

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        #: scope node (function or class) -> [(wrapped name, from line)]
        self._wrapped: Dict[cst.CSTNode, List[Tuple[str, int]]] = {}
        #: functions that get the model before and after the wrap (reported once)
        self._shared_helpers: Set[cst.FunctionDef] = set()
        self._rebinds: Dict[Tuple[cst.CSTNode, str], List[int]] = {}  # (scope, name) -> lines
        self._noted_savers: Set[cst.Call] = set()
        #: calls of another module's function that get ``name.module`` for ``name``
        self._handed_the_module: Dict[cst.Call, str] = {}
        #: ``model = torch.load(f)`` of a model saved whole, wrapped in DDP again
        self._rewrapped_loads: Set[cst.Assign] = set()
        self._imported: Optional[Dict[str, ModelAttributeFunction]] = None  # (_imported_functions)

    def visit_Module(self, node: cst.Module) -> None:
        wraps: List[Tuple[cst.Assign, str]] = []
        for assign in P.find(node, cst.Assign):
            if self.is_call(assign.value, N.DDP) and len(assign.targets) == 1:
                name = P.dotted_name(assign.targets[0].target)
                if name:
                    wraps.append((assign, name))
        for assign, name in wraps:
            line = self.position(assign)[0]
            func = self.enclosing_function(assign)
            if name.startswith("self."):
                owner = next((a for a in self.ancestors(assign) if isinstance(a, cst.ClassDef)), None)
                self._wrapped.setdefault(owner or self.module, []).append((name, 0))
                if func is not None:
                    self._wrapped.setdefault(func, []).append((name, line))
            else:
                self._wrapped.setdefault(func or self.module, []).append((name, line))
                self._follow_calls(func or self.module, name, line)
                if func is None and "." not in name:
                    self._follow_global(name, line)

    def _follow_global(self, name: str, line: int) -> None:
        """A model wrapped at module level and used as a global by the file's
        functions (``def train_step(x): hidden = rnn.init_hidden(...)``): those
        functions see the wrapper too -- unless one also runs before the wrap."""
        for function in (s for s in self.module.body if isinstance(s, cst.FunctionDef)):
            if not _uses_global(function, name) or not (
                _needs_the_module(function, name) or self._saved_whole(name, function)
            ):
                continue  # (calls, train()/eval(), parameters(): DDP provides them)
            if self._called_before(function, self.module, line):
                continue
            if (name, 0) not in self._wrapped.get(function, []):
                self._wrapped.setdefault(function, []).append((name, 0))

    def _follow_calls(self, scope: cst.CSTNode, name: str, line: int, cls: Optional[cst.ClassDef] = None, depth: int = 0) -> None:
        """Functions, classes and methods of this file that receive the wrapped model
        (after the wrap), a few calls deep: ``train(model, ...)`` and what it calls
        with it; ``Trainer(model, ...)`` whose ``__init__`` keeps it as ``self.model``;
        ``early_stopping(loss, model)`` of ``early_stopping = EarlyStopping(...)`` (its
        ``__call__``), and from there ``self.save_checkpoint(loss, model)``."""
        if depth >= 3:
            return
        defs = {s.name.value: s for s in self.module.body if isinstance(s, cst.FunctionDef)}
        classes = {s.name.value: s for s in self.module.body if isinstance(s, cst.ClassDef)}
        instances = {}  # local name -> class, from ``x = SomeClass(...)`` in this scope
        foreign = {}  # local name -> name of a class of another module that saves (EarlyStopping)
        for assign in P.find(scope, cst.Assign):
            if (
                len(assign.targets) == 1
                and isinstance(assign.targets[0].target, cst.Name)
                and isinstance(assign.value, cst.Call)
                and isinstance(assign.value.func, cst.Name)
            ):
                if assign.value.func.value in classes:
                    instances[assign.targets[0].target.value] = classes[assign.value.func.value]
                elif _SAVING_CLASS.search(assign.value.func.value):
                    foreign[assign.targets[0].target.value] = assign.value.func.value
        copies = self._copies_of(scope, name, line)
        for call in P.find(scope, cst.Call):
            if (self.enclosing_function(call) or self.module) is not scope or self.position(call)[0] <= line:
                continue
            func = call.func
            if copies and self._updates_a_copy(call, name, copies, defs, classes, instances):
                continue
            if isinstance(func, cst.Name) and func.value in defs:
                if not any(P.dotted_name(a.value) == name for a in call.args):
                    continue  # (the model is not handed to it: nothing to follow, nothing to say)
                if self._called_before(defs[func.value], scope, line):
                    continue
                self._follow_into(defs[func.value], call, name, None, depth)
            elif isinstance(func, cst.Name) and func.value in classes:
                self._follow_into(_method(classes[func.value], "__init__"), call, name, classes[func.value], depth)
            elif isinstance(func, cst.Name) and func.value in instances:
                self._follow_into(_method(instances[func.value], "__call__"), call, name, instances[func.value], depth)
            elif isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value in instances:
                owner = instances[func.value.value]
                self._follow_into(_method(owner, func.attr.value), call, name, owner, depth)
            elif isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value in classes:
                owner = classes[func.value.value]  # Saver.save(model, path): a static method
                method = _method(owner, func.attr.value)
                if method is not None and any(P.dotted_name(d.decorator) == "staticmethod" for d in method.decorators):
                    self._follow_into(method, call, name, owner, depth)
            elif isinstance(func, cst.Attribute) and m.matches(func.value, m.Name("self")) and cls is not None:
                self._follow_into(_method(cls, func.attr.value), call, name, cls, depth)
            elif isinstance(func, cst.Name) and func.value in dict(self.role.imported_state_dict_savers) and (
                self.ast_source.aliases.get(func.value, "").rsplit(".", 1)[-1] == func.value
            ):
                self._note_imported_saver(call, name, *dict(self.role.imported_state_dict_savers)[func.value])
            elif isinstance(func, cst.Name) and func.value in self._imported_functions():
                self._hand_over(call, scope, name, self._imported_functions()[func.value])
            elif (imported := self._imported_module_function(func)) is not None:  # utils.restart_from_checkpoint(...)
                self._hand_over(call, scope, name, imported)
            elif isinstance(func, (cst.Name, cst.Attribute)) and _SAVER.search(P.dotted_name(func).rsplit(".", 1)[-1]):
                self._note_foreign_saver(call, name)
            elif P.dotted_name(func).split(".", 1)[0] in foreign:  # early_stopping(val_loss, model)
                self._note_foreign_saver(call, name, foreign[P.dotted_name(func).split(".", 1)[0]])

    def _copies_of(self, scope: cst.CSTNode, name: str, line: int) -> Set[str]:
        """Names bound after the wrap to ``copy.deepcopy(name)`` (also with
        ``.eval().requires_grad_(False)`` after it): the EMA copy of the model."""
        copies = set()
        for assign in P.find(scope, cst.Assign):
            value = assign.value
            while (
                isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
                and "copy.deepcopy" not in self.qnames(value.func)
            ):
                value = value.func.value  # .eval().requires_grad_(False)
            if (
                len(assign.targets) == 1 and isinstance(assign.targets[0].target, cst.Name)
                and isinstance(value, cst.Call) and value.args and "copy.deepcopy" in self.qnames(value.func)
                and P.dotted_name(value.args[0].value) == name and self.position(assign)[0] > line
            ):
                copies.add(assign.targets[0].target.value)
        return copies

    def _updates_a_copy(self, call: cst.Call, name: str, copies: Set[str], defs, classes, instances) -> bool:
        """``ema.step_ema(ema_model, model)`` of another module: an EMA update that
        reads the model's parameters or ``state_dict()`` into its copy -- the copy is
        of the bare model (``copy.deepcopy(model.module)``), so it gets ``model.module``
        (the keys and the parameters match; the update runs no forward pass)."""
        handed = [P.dotted_name(a.value) for a in call.args if not a.star]
        if name not in handed or not copies & set(handed):
            return False
        head = P.dotted_name(call.func).split(".", 1)[0]
        if head in defs or head in classes or head in instances or head == "self":
            return False  # followed into (the same file's EMA class gets .module there)
        self._handed_the_module[call] = name
        self.changed(
            call, f"{P.dotted_name(call.func)}() updates the copy of the model: it gets {name}.module, as the copy is"
        )
        return True

    def _imported_functions(self) -> Dict[str, ModelAttributeFunction]:
        """The functions of the modules this file imports that read their
        parameters' own attributes (``FileRole.imported_model_functions``), by the
        names this file imports them as (``from generate import generate``)."""
        if self._imported is None:
            self._imported = self._find_imported_functions()
        return self._imported

    def _find_imported_functions(self) -> Dict[str, ModelAttributeFunction]:
        return A.imported_functions_by_alias(  # type: ignore[return-value]
            self.ast_source, dict(self.role.imported_model_functions)
        )

    def _imported_module_function(self, func: cst.BaseExpression) -> Optional[ModelAttributeFunction]:
        """``utils.f`` where ``utils`` is a module of the program this file imports
        (``import utils``) and ``f`` one of its functions that read their parameters'
        own attributes."""
        if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)):
            return None
        module = self.ast_source.aliases.get(func.value.value)
        if module is None or module.split(".", 1)[0] in ("torch", "builtins"):
            return None
        if func.value.value in {s.name.value for s in self.module.body if isinstance(s, (cst.FunctionDef, cst.ClassDef))}:
            return None
        return dict(self.role.imported_model_functions).get(func.attr.value)

    def _hand_over(self, call: cst.Call, scope: cst.CSTNode, name: str, function: ModelAttributeFunction) -> None:
        """``generate(decoder, "Wh")`` of another module, which reads
        ``decoder.init_hidden``: DDP has no such attribute.  A function that neither
        trains nor is called where the model trains (its forward would bypass DDP's
        gradient sync) gets ``decoder.module``; otherwise it is reported."""
        received = _parameters_receiving(call, function.params, name)
        attributes = dict(function.attributes)
        needed = [(p, attributes[p]) for p in received if p in attributes]
        if KEYWORDS_LOADED in attributes:  # ``restart_from_checkpoint(path, state_dict=model)``
            needed += [(p, attributes[KEYWORDS_LOADED]) for p in received if p not in function.params]
        if not needed:
            return
        param, attribute = needed[0]
        callee = P.dotted_name(call.func)
        if not function.trains and all(a in ("state_dict", "load_state_dict") for _, a in needed):
            # it only saves or loads a state_dict (no forward to bypass DDP): the bare
            # model's keys are those of the checkpoints this file saves, model.module's
            self._handed_the_module[call] = name
            self.changed(
                call,
                f"{callee}() (another module) calls {param}.{attribute}(): it gets {name}.module, whose keys have "
                "no 'module.' prefix, as the checkpoints saved here",
            )
            return
        if function.trains or self._trains_here(scope):
            self.manual(
                call,
                f"{callee}() (another module) reads {param}.{attribute}, which the DDP wrapper of {name} does "
                f"not have: in {callee}(), use {param}.module.{attribute} (passing {name}.module would "
                "train past DDP's gradient sync)",
            )
            return
        self._handed_the_module[call] = name
        self.changed(
            call,
            f"{callee}() (another module) reads {param}.{attribute}, which DDP does not forward: it gets {name}.module",
        )

    def _trains_here(self, scope: cst.CSTNode) -> bool:
        """A ``backward()`` in ``scope`` itself (not in a function defined in it)."""
        return any(
            isinstance(c.func, cst.Attribute) and c.func.attr.value == "backward"
            and (self.enclosing_function(c) or self.module) is scope
            for c in P.find(scope, cst.Call)
        )

    def _note_foreign_saver(self, call: cst.Call, name: str, owner: Optional[str] = None) -> None:
        """``save_checkpoint(model, path)`` of another module (``from utils import
        save_checkpoint``) gets the DDP wrapper now: what it saves of it -- its
        ``state_dict()`` -- gains the ``module.`` prefix, which code here cannot see."""
        if call in self._noted_savers or not any(
            P.dotted_name(a.value) == name and a.keyword is None for a in call.args
        ):
            return
        if any(q == "torch" or q.startswith("torch.") for q in self.qnames(call.func)):
            return  # torch.save(model, ...): rewritten where it is (leave_Call)
        self._noted_savers.add(call)
        callee = P.dotted_name(call.func) + (f"() of {owner}" if owner else "()")
        self.note(
            call,
            f"{callee} (not in this file) now gets {name} wrapped in DDP: if it saves "
            f"{name}.state_dict() the keys gain a 'module.' prefix; pass {name}.module to keep "
            "the checkpoint format",
        )

    def _note_imported_saver(self, call: cst.Call, name: str, params, saved) -> None:
        """``Trainer(model, opt, args)`` of another module, which keeps the model and
        saves ``self.model.state_dict()`` (``FileFacts.state_dict_savers``): it now
        gets the DDP wrapper, so its checkpoints gain the ``module.`` prefix -- said
        at the call (the other module may get a bare model from its other callers)."""
        handed = _parameters_receiving(call, params, name)
        param = next((p for p in handed if p in saved), None)
        if param is None or call in self._noted_savers:
            return
        self._noted_savers.add(call)
        callee = P.dotted_name(call.func)
        self.note(
            call,
            f"{callee} (another module) saves the state_dict() of the {param} it is handed, which is now "
            f"{name} wrapped in DDP: its checkpoints' keys gain a 'module.' prefix; save its .module's "
            "state_dict() there to keep the format (or strip the prefix where they are loaded: "
            "torch.nn.modules.utils.consume_prefix_in_state_dict_if_present)",
        )

    def _called_before(self, function: cst.FunctionDef, scope: cst.CSTNode, line: int) -> bool:
        """``function`` is also called in ``scope`` before the wrap (on the bare
        model): adding ``.module`` in it would break that call -- reported instead."""
        name = function.name.value
        for call in P.find(scope, cst.Call):
            if (
                m.matches(call.func, m.Name(name))
                and (self.enclosing_function(call) or self.module) is scope
                and self.position(call)[0] < line
            ):
                if function in self._shared_helpers:
                    return True  # reported at its first call after the wrap
                self._shared_helpers.add(function)
                self.manual(
                    function,
                    f"{name}() gets the model both before and after its DDP wrap: where it uses "
                    "the model's own attributes or state_dict(), use .module after the wrap by hand",
                )
                return True
        return False

    def _follow_into(
        self, callee: Optional[cst.FunctionDef], call: cst.Call, name: str, cls: Optional[cst.ClassDef], depth: int
    ) -> None:
        if callee is None:
            return
        decorators = {P.dotted_name(d.decorator) for d in callee.decorators}
        params = [p.name.value for p in callee.params.params]
        if cls is not None and "staticmethod" not in decorators:
            params = params[1:]  # self (or cls)
        for param in _parameters_receiving(call, params, name):
            if (param, 0) in self._wrapped.get(callee, []):
                continue
            self._wrapped.setdefault(callee, []).append((param, 0))
            self._follow_calls(callee, param, 0, cls, depth + 1)
            if cls is not None and callee.name.value == "__init__":
                # Trainer(model, ...): self.model = model, in every method of the class
                for assign in P.find(callee, cst.Assign):
                    if m.matches(assign.value, m.Name(param)):
                        for target in assign.targets:
                            attribute = P.dotted_name(target.target)
                            if attribute.startswith("self.") and (attribute, 0) not in self._wrapped.get(cls, []):
                                self._wrapped.setdefault(cls, []).append((attribute, 0))
                                for method in P.find(cls, cst.FunctionDef):
                                    self._follow_calls(method, attribute, 0, cls, depth + 1)

    def _is_wrapped(self, value: cst.BaseExpression, at: cst.CSTNode) -> bool:
        name = P.dotted_name(value)
        if not name:
            return False
        line = self.position(at)[0]
        for anc in self.ancestors(at):
            entries = [start for wrapped, start in self._wrapped.get(anc, ()) if wrapped == name]
            if entries:  # the nearest scope that knows about the wrap decides
                start = min(entries)
                # (start 0: a parameter or attribute that received the model, as bound)
                return line > start and not (start and any(start < r < line for r in self._rebound(anc, name)))
        return False

    def _rebound(self, scope: cst.CSTNode, name: str) -> List[int]:
        """Lines where ``name`` gets another object in ``scope`` (``model = {...}``
        after the wrap; ``model = model.cpu()`` and the wrap itself are the same model)."""
        key = (scope, name)
        cache = self._rebinds
        if key not in cache:
            lines = []
            for assign in P.find(scope, cst.Assign):
                if not any(P.dotted_name(t.target) == name for t in assign.targets):
                    continue
                value = assign.value
                while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
                    value = value.func.value  # model.to(device).eval(): the same one
                if P.dotted_name(value) == name or self.is_call(assign.value, N.DDP):
                    continue
                if self.is_call(assign.value, N.TORCH_LOAD) and self._saved_whole(name):
                    continue  # the DDP wrapper it saved (left as it is), loaded back

                lines.append(self.position(assign)[0])
            cache[key] = lines
        return cache[key]

    def _saved_whole(self, name: str, scope: Optional[cst.CSTNode] = None) -> bool:
        """``torch.save(name, ...)`` in ``scope`` (None: anywhere in the file) -- the
        wrapper is pickled: it loads back only with a process group."""
        calls = self.module_calls if scope is None else P.find(scope, cst.Call)
        return any(
            self.is_call(c, N.TORCH_SAVE) and c.args and P.dotted_name(c.args[0].value) == name
            for c in calls
        )

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        """``torch.save(model, path)`` saved the bare model; saved wrapped, it would
        be a DDP object that cannot be loaded without a process group."""
        if original_node in self._handed_the_module:
            name = self._handed_the_module[original_node]
            args = [
                new.with_changes(value=cst.Attribute(value=new.value, attr=cst.Name("module")))
                if P.dotted_name(old.value) == name and not old.star
                else new
                for old, new in zip(original_node.args, updated_node.args)
            ]
            return updated_node.with_changes(args=args)
        if original_node.args and "copy.deepcopy" in self.qnames(original_node.func):
            # ``ema_model = copy.deepcopy(model)`` (an EMA, a teacher): a copy of the
            # model, as before -- not a second DDP wrapper with 'module.' keys
            first = original_node.args[0]
            if first.keyword is None and not first.star and self._is_wrapped(first.value, first.value):
                self.changed(original_node, f"copy.deepcopy({P.dotted_name(first.value)}) copies the model, not its DDP wrapper")
                value = self._through_module(first.value, updated_node.args[0].value)
                return updated_node.with_changes(args=[updated_node.args[0].with_changes(value=value), *updated_node.args[1:]])
        if m.matches(original_node.func, m.Name()) and original_node.func.value in _CONTAINER_BUILTINS:
            # enumerate(model), len(model), list(model) of a wrapped nn.Sequential
            args = [
                new.with_changes(value=self._through_module(old.value, new.value))
                if old.keyword is None and not old.star and self._is_wrapped(old.value, old.value)
                else new
                for old, new in zip(original_node.args, updated_node.args)
            ]
            return updated_node.with_changes(args=args)
        if not (self.is_call(original_node, N.TORCH_SAVE) and original_node.args):
            return updated_node
        first = original_node.args[0]
        if first.keyword is None and isinstance(first.value, (cst.Dict, cst.List, cst.Tuple)):
            return self._container_saved(original_node, updated_node)
        if first.keyword is not None or not self._is_wrapped(first.value, original_node):
            return updated_node
        name = P.dotted_name(first.value)
        if A.loaded_back(self.ast_source, name):
            # the code after the load uses .module (rewritten here): it must get the wrapper back
            if not self._loads_rewrapped(name, original_node):
                self.manual(original_node, _loaded_back_message(name))
                return updated_node
            self.changed(
                original_node,
                f"torch.save({name}) saves {name}.module (a file that loads without a process group); "
                f"where the script loads it back into {name}, it is wrapped in DDP again",
            )
        else:
            self.changed(original_node, f"torch.save({name}) saves {name}.module: the model, as before, not its DDP wrapper")
        new_first = updated_node.args[0]
        value = cst.Attribute(value=new_first.value, attr=cst.Name("module"))
        return updated_node.with_changes(args=[new_first.with_changes(value=value), *updated_node.args[1:]])

    def _loads_rewrapped(self, name: str, save: cst.Call) -> bool:
        """Every ``name = torch.load(...)`` after the wrap (the model saved whole,
        read back for the test run) can be wrapped in DDP again: a statement of its
        own, on every rank, with the process group up.  Those loads are then noted
        for ``leave_Assign``; False (nothing noted) when one cannot."""
        loads = [
            a for a in P.find(self.module, cst.Assign)
            if any(P.dotted_name(t.target) == name for t in a.targets)
            and any(self.is_call(c, N.TORCH_LOAD) for c in P.find(a.value, cst.Call))
            and self._is_wrapped(a.targets[0].target, a)
        ]
        if not loads:
            return False
        for assign in loads:
            stmt = self.statement_of(assign)
            if (
                not isinstance(stmt, cst.SimpleStatementLine) or len(assign.targets) != 1
                or P.under_main_process_check(self, assign) or self.before_process_group(stmt) is not None
                or self.rank_name(assign, "local_rank") is None
            ):
                return False
        self._rewrapped_loads.update(loads)
        return True

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        if original_node not in self._rewrapped_loads:
            return updated_node
        ddp = self.object_alias("torch.nn.parallel", "DistributedDataParallel", N.DDP)
        local_rank = self.rank_name(original_node, "local_rank")
        wrapped = cst.parse_expression(
            f"{ddp}(LOADED, device_ids=[{local_rank}] if {self.torch()}.cuda.is_available() else None)"
        )
        assert isinstance(wrapped, cst.Call)
        wrapped = wrapped.with_changes(args=[wrapped.args[0].with_changes(value=updated_node.value), *wrapped.args[1:]])
        self.changed(original_node, "the model loaded back is wrapped in DDP again (the code after it expects the wrapper)")
        return updated_node.with_changes(value=wrapped)

    def _container_saved(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        """``torch.save({"decoder": decoder, "epoch": e}, path)``: the wrapped model
        held in the dict (or list) is saved as ``decoder.module``, the model as before."""
        old_value, new_value = original.args[0].value, updated.args[0].value
        elements = []
        changed = []
        for old, new in zip(old_value.elements, new_value.elements):
            value = getattr(old, "value", None)
            if isinstance(old, (cst.DictElement, cst.Element)) and value is not None and self._is_wrapped(value, original):
                name = P.dotted_name(value)
                if A.loaded_back(self.ast_source, name):
                    self.manual(original, _loaded_back_message(name))
                    return updated
                changed.append(name)
                new = new.with_changes(value=cst.Attribute(value=new.value, attr=cst.Name("module")))
            elements.append(new)
        if not changed:
            return updated
        for name in changed:
            self.changed(original, f"torch.save saves {name}.module in the checkpoint: the model, as before, not its DDP wrapper")
        first = updated.args[0].with_changes(value=new_value.with_changes(elements=elements))
        return updated.with_changes(args=[first, *updated.args[1:]])

    def leave_Subscript(self, original_node: cst.Subscript, updated_node: cst.Subscript) -> cst.Subscript:
        """``model[0]`` of a wrapped ``nn.Sequential``: DDP is not indexable."""
        if not self._is_wrapped(original_node.value, original_node):
            return updated_node
        name = P.dotted_name(original_node.value)
        self.changed(original_node, f"{name}[...] goes through .module (the model is wrapped in DDP now)")
        return updated_node.with_changes(value=cst.Attribute(value=updated_node.value, attr=cst.Name("module")))

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        """``for layer in model`` (a wrapped ``nn.Sequential``): DDP is not iterable."""
        if self._is_wrapped(original_node.iter, original_node.iter):
            return updated_node.with_changes(iter=self._through_module(original_node.iter, updated_node.iter))
        return updated_node

    def _through_module(self, original: cst.BaseExpression, updated: cst.BaseExpression) -> cst.Attribute:
        name = P.dotted_name(original)
        self.changed(original, f"{name} used as a container goes through .module (the model is wrapped in DDP now)")
        return cst.Attribute(value=updated, attr=cst.Name("module"))

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        if original_node.attr.value in DDP_API:
            return updated_node
        if not self._is_wrapped(original_node.value, original_node):
            return updated_node
        if self._is_assign_target(original_node):
            return updated_node
        self.changed(
            original_node,
            f"{P.dotted_name(original_node.value)}.{original_node.attr.value} goes through .module "
            "(the model is wrapped in DDP now)",
        )
        if self._forward_bypasses_ddp(original_node):
            self.manual(
                original_node,
                f"{P.dotted_name(original_node.value)}.{original_node.attr.value}(...) runs part of "
                "the model outside the DDP wrapper in a training function: call the wrapped "
                "model instead, or its gradients are not averaged across processes",
            )
        return updated_node.with_changes(
            value=cst.Attribute(value=updated_node.value, attr=cst.Name("module"))
        )

    def _forward_bypasses_ddp(self, node: cst.Attribute) -> bool:
        """``model.encoder(x)`` called where a ``backward()`` follows it (training)."""
        method = node.attr.value
        if A.runs_no_forward(method) or method in self.role.program_optimizer_methods:
            return False  # saving, loading, configuring (init_hidden(bsz), configure_optimizers): no forward
        call = self.parent(node)
        if not (isinstance(call, cst.Call) and call.func is node):
            return False
        func = self.enclosing_function(node)
        if func is None:
            return False
        line = self.position(node)[0]
        loop = next((a for a in self.ancestors(node) if isinstance(a, (cst.For, cst.While))), None)
        found = [
            inner
            for inner in P.find(loop or func, cst.Call)
            if m.matches(inner.func, m.Attribute(attr=m.Name("backward"))) and self.position(inner)[0] >= line
        ]
        if loop is not None and not found:
            # a backward earlier in the same loop body runs after this call next time round
            found = [1] if _calls_backward(loop) else []
        return bool(found)

    def _is_assign_target(self, node: cst.Attribute) -> bool:
        parent = self.parent(node)
        return isinstance(parent, cst.AssignTarget)


def _uses_global(function: cst.FunctionDef, name: str) -> bool:
    """``function`` reads the module's ``name`` (not a parameter, never bound in it)."""
    if name in {p.name.value for p in (*function.params.params, *function.params.kwonly_params)}:
        return False
    bound = any(
        isinstance(t.target, cst.Name) and t.target.value == name
        for a in P.find(function, cst.Assign) for t in a.targets
    ) or any(m.matches(g, m.Global()) for g in P.find(function, cst.Global))
    return not bound and any(n.value == name for n in P.find(function, cst.Name))


def _needs_the_module(function: cst.FunctionDef, name: str) -> bool:
    """``function`` reaches an attribute of ``name`` that DDP does not forward."""
    return any(
        m.matches(a.value, m.Name(name)) and a.attr.value not in DDP_API
        for a in P.find(function, cst.Attribute)
    )


def _parameters_receiving(call: cst.Call, params, name: str) -> List[str]:
    """The parameters (of ``params``, in order) that ``call`` hands ``name`` to,
    by position or by keyword."""
    received = [
        params[index]
        for index, arg in enumerate(a for a in call.args if a.keyword is None and not a.star)
        if P.dotted_name(arg.value) == name and index < len(params)
    ]
    return received + [a.keyword.value for a in call.args if a.keyword is not None and P.dotted_name(a.value) == name]


def _method(cls: cst.ClassDef, name: str) -> Optional[cst.FunctionDef]:
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else []
    return next((s for s in body if isinstance(s, cst.FunctionDef) and s.name.value == name), None)
