"""DDP001 data-parallel-to-ddp: replace ``nn.DataParallel`` with ``DistributedDataParallel``.

``DataParallel`` is one process driving every GPU from threads: GPU 0 gathers the
outputs and the GIL serialises the work.  Under DDP each process wraps its own
replica, on its own device::

    model = nn.DataParallel(model, device_ids=[0, 1]).cuda()

becomes::

    model = DistributedDataParallel(
        model.to(device), device_ids=[local_rank] if torch.cuda.is_available() else None
    )

* every spelling is found by qualified name (``torch.nn.DataParallel``,
  ``nn.parallel.DataParallel``, ``from torch.nn.parallel import DataParallel as DP``);
  a project's own class named ``DataParallel`` is left alone (and reported);
* the module is moved to the process's device before it is wrapped (DDP needs
  that); a ``.cuda()``/``.to()`` chained on the wrapper is folded into it;
* ``device_ids``/``output_device`` (the GPU list of the one DP process) are dropped;
  ``dim`` is kept (also given by position); on CPU ``device_ids`` is ``None`` as DDP
  requires; comments among the arguments are kept (one argument per line);
* a guard that wrapped only on several GPUs (``if torch.cuda.device_count() > 1:``,
  ``if device == "cuda":``) is removed: under DDP every process, GPU or CPU, must
  wrap, or the processes' gradients are never averaged;
* ``isinstance(model, nn.DataParallel)`` checks test for DDP instead, so code that
  unwraps ``model.module`` keeps working; the unused import is removed.

Subclasses of DataParallel and the functional ``nn.parallel.data_parallel`` are
reported as manual steps.  In a file that already sets DDP up itself (a script
with a DDP path and a DataParallel fallback) nothing is changed.
"""

from __future__ import annotations

import ast
import re

from typing import Dict, List, Optional, Set, Tuple, Union

import libcst as cst
import libcst.matchers as m

from . import _analysis as A
from . import _names as N
from . import _patterns as P
from ._base import FileRole, Transform
from ._model import local_data_parallel_note


class DataParallelToDDP(Transform):
    CODE = "DDP001"
    NAME = "data-parallel-to-ddp"
    DESCRIPTION = "Replace nn.DataParallel with DistributedDataParallel on this process's device."
    # DataParallel, but not as the tail of DistributedDataParallel (a converted file)
    TRIGGERS = (re.compile(r"(?<!Distributed)DataParallel|data_parallel"),)

    @classmethod
    def applies_to(cls, role: FileRole) -> bool:
        return True  # a mixed DDP/DP file still gets its DP branch reported

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._converted: Set[cst.Call] = set()
        #: the DDP calls written for them (in the updated tree: an inner condition's
        #: wrap taken out of it is found again by the condition around it)
        self._made_wraps: Set[cst.Call] = set()
        #: lines of the wraps converted (the statement's first line)
        self._wrapped_lines: Set[int] = set()
        self._saves: Optional[Dict[int, Tuple[int, str]]] = None
        self._checkpoint_dicts: Optional[Dict[int, Tuple[int, str]]] = None
        self._helper_saves: Optional[Dict[int, Tuple[int, str, str, str]]] = None
        self._unwrapped_noted = False
        self._frozen_left: Set[cst.Call] = set()
        #: the file sets up DDP itself (a DataParallel here is its non-distributed
        #: branch); not so for one dp2ddp converted, whose DataParallel was left
        self._hand_made = self.role.already_distributed and not self.role.set_up_by_dp2ddp
        self._partial: Optional[Dict[int, Tuple[str, str, str]]] = None
        #: ``model.encoder = DataParallel(model.encoder)`` made ``model = DDP(model...)``: assign -> "model"
        self._whole_wraps: Dict[cst.Assign, str] = {}
        self._past_wrapper_reported: Set[cst.CSTNode] = set()

    def visit_Module(self, node: cst.Module) -> None:
        if self._hand_made:
            return
        self.drop_imports_if_unused(lambda qualified, bound: qualified in N.DATA_PARALLEL)
        if self.role.in_program:
            self._report_models_trained_unwrapped()
        for message in _messages_naming_data_parallel(self.ast_source):
            stmt = self.statement_at(message.lineno)
            if stmt is not None:
                self.note(
                    stmt,
                    "this message still says DataParallel, which the converted program no longer "
                    "uses: reword it (one process per GPU, DistributedDataParallel)",
                )
        for reference in A.bare_data_parallel_references(self.ast_source):
            stmt = self.statement_at(reference.lineno)
            if stmt is not None:
                self.manual(
                    stmt,
                    "DataParallel named here but not called (an alias, a factory argument): the "
                    "wrap made through it is not converted; pass DistributedDataParallel as in "
                    "the converted wraps, by hand",
                )

    def _report_models_trained_unwrapped(self) -> None:
        """A model an optimizer of this file trains that no DataParallel wraps (a
        student beside a teacher in DataParallel): the program converted, nothing
        would average its gradients (``A.optimizers_of_unwrapped_models``, lint's
        DDP009 on the output)."""
        src = self.ast_source
        if not A.calls_method(src.tree, "backward"):
            return
        wrapped = A.wrapped_models(src, N.DATA_PARALLEL)
        if not wrapped:
            return  # (no DataParallel wrap, or one whose model cannot be named)
        # (model.encoder = DataParallel(model.encoder), converted to a wrap of model as a whole)
        wrapped |= {whole for whole, _, blocker in self._partial_wraps().values() if not blocker}
        for optimizer, name in A.optimizers_of_unwrapped_models(src, wrapped, N.DATA_PARALLEL):
            stmt = self.statement_at(optimizer.lineno)
            if stmt is not None:
                self.manual(
                    stmt,
                    f"this optimizer trains `{name}`, which no DataParallel wraps: converted to DDP with "
                    f"sharded data, nothing would average its gradients and each process would train its "
                    f"own copy; wrap it ({name} = DistributedDataParallel({name}, device_ids=[local_rank])) "
                    "before training, or leave it on one process",
                    code="DDP009",
                )

    # class MyDP(nn.DataParallel) -------------------------------------------
    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        for base in node.bases:
            if self.is_ref(base.value, N.DATA_PARALLEL):
                self.manual(
                    node,
                    f"class {node.name.value} subclasses DataParallel: port it to a DDP "
                    "wrapper (or drop it) by hand",
                )

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        """``state = {"net": net, ...}`` later handed to ``torch.save(state, ...)``:
        the checkpoint holds the bare model (see ``_bare``).  ``model.encoder =
        DataParallel(model.encoder)`` wrapped whole: ``model = DDP(model...)``."""
        whole = self._whole_wraps.get(original_node)
        if whole is not None:
            target = cst.parse_expression(whole)
            return updated_node.with_changes(targets=[updated_node.targets[0].with_changes(target=target)])
        if not isinstance(original_node.value, (cst.Dict, cst.List, cst.Tuple)) or not self._wrapped_lines:
            return updated_node
        if self._checkpoint_dicts is None:
            self._checkpoint_dicts = A.checkpoint_dicts_holding(self.ast_source, N.DATA_PARALLEL)
        found = self._checkpoint_dicts.get(self.position(original_node.value)[0])
        if found is None or found[0] not in self._wrapped_lines or not _holds_the_model(original_node.value, found[1]):
            return updated_node
        name = found[1]
        self.changed(
            original_node,
            f"the checkpoint saved from here holds {name}.module: a pickled DDP wrapper cannot be "
            "loaded without a process group; code that loads it now gets the model itself (no .module)",
        )
        return updated_node.with_changes(value=_bare(updated_node.value, name))

    # calls -------------------------------------------------------------------
    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self.is_call(original_node, N.DATA_PARALLEL):
            left = sum(f.kind == "manual" for f in self.findings)
            result = _parenthesized_as(updated_node, self._convert(original_node, updated_node))
            if (
                original_node not in self._converted
                and original_node not in self._frozen_left
                and sum(f.kind == "manual" for f in self.findings) > left
            ):
                self._left_unwrapped(original_node)
            return result
        if self._saves_wrapped(original_node):
            name = P.dotted_name(original_node.args[0].value)
            if A.loaded_back(self.ast_source, name):
                self.manual(original_node, _loaded_back_message(name))
                return updated_node
            return self._save_module(original_node, updated_node)
        self._report_helper_save(original_node)
        func = original_node.func
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value in ("cuda", "to")
            and func.value in self._converted
        ):
            # DataParallel(model).cuda(): the wrapped module is moved already
            assert isinstance(updated_node.func, cst.Attribute)
            return _parenthesized_as(updated_node, updated_node.func.value)
        if self.is_call(original_node, N.DATA_PARALLEL_FUNCTION):
            self.manual(
                original_node,
                "functional data_parallel(): call the DDP-wrapped module instead",
            )
        elif m.matches(func, m.Name("isinstance")) and len(original_node.args) == 2:
            return self._isinstance(original_node, updated_node)
        elif self._data_parallel_only(func):
            self.manual(
                original_node,
                f"{P.dotted_name(func) or 'this call'} (Synchronized-BatchNorm-PyTorch) works only "
                "with DataParallel: under DDP synchronise BatchNorm with "
                "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before the wrap, and drop this",
            )
        elif self._local_data_parallel(func):
            self.note(original_node, local_data_parallel_note(", ".join(sorted(self.qnames(func)))))
        return updated_node

    def _left_unwrapped(self, call: cst.Call) -> None:
        """Said once per file: the rest of the program is converted (data sharded,
        process group up), so a wrap left as DataParallel trains unsynchronised copies."""
        if self._unwrapped_noted or not self.role.in_program or self._hand_made:
            return  # (a script that does not train, a hand-made DDP file: nothing data-parallel to lose)
        self._unwrapped_noted = True
        self.note(
            call,
            "until this wrap is DDP, the converted program is not data-parallel: every process "
            "trains its own copy of the model on its shard of the data and the copies drift apart",
        )

    def _data_parallel_only(self, func: cst.BaseExpression) -> bool:
        """A helper that exists for DataParallel's replicas (vendored in many
        segmentation repos as ``sync_batchnorm``), resolved through the imports."""
        return any(q.rsplit(".", 1)[-1] in _DATA_PARALLEL_ONLY for q in self.qnames(func))

    def _local_data_parallel(self, func: cst.BaseExpression) -> bool:
        name = func.attr.value if isinstance(func, cst.Attribute) else getattr(func, "value", None)
        return name == "DataParallel" and not self.is_ref(func, N.DATA_PARALLEL)

    def _convert(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        if self._hand_made:
            self.note(
                original,
                "DataParallel left as is: this file already sets up DDP and this is its "
                "non-distributed branch",
            )
            return updated
        if not self.role.in_program:
            # (evaluate.py, predict.py: one process, as before -- DataParallel still works there)
            self.note(
                original,
                "DataParallel left as is: this file does not train and no training entry point "
                "imports it, so it runs as one process, as before (an evaluation or export script)",
            )
            return updated
        too_early = self.before_process_group(original)
        if too_early:
            self.manual(original, f"DataParallel wrapped {too_early}")
            return updated
        parent = self.parent(original)
        if isinstance(parent, cst.Call) and parent.func is original:
            self.manual(
                original,
                "DataParallel built and called in one expression (a new wrapper on every call): "
                "wrap the model in DDP once, where it is built, and call that",
            )
            return updated
        if any(arg.star for arg in original.args):
            self.manual(original, "DataParallel called with *args/**kwargs: wrap the module in DDP by hand")
            return updated
        part = self._part_of_a_trained_model(original)
        original_module = next(
            (a.value for a in original.args if a.keyword is None or a.keyword.value == "module"), None
        )
        if part:
            whole, part_name, blocker = part
            assign = self.parent(original)
            if blocker or not (
                isinstance(assign, cst.Assign) and len(assign.targets) == 1 and original_module is not None
                and P.dotted_name(assign.targets[0].target) == part_name == P.dotted_name(original_module)
            ):
                advice = A.PARTLY_WRAPPED_ADVICE.format(whole=whole, part=part_name)
                self.manual(original, f"{advice}{f' -- not done here: {blocker}' if blocker else ''}", code="DDP009")
                return updated
            # the whole model goes into the wrap: model = DDP(model...) (leave_Assign)
            inner = part_name[len(whole) + 1:]
            self._whole_wraps[assign] = whole
            original_module = cst.parse_expression(whole)
            updated = updated.with_changes(args=[
                a.with_changes(value=original_module) if a.value is updated.args[0].value else a
                for a in updated.args
            ])
            self.note(
                original,
                f"{whole} is wrapped whole, not only {part_name}: DDP averages the gradients of every "
                f"parameter that trains (DataParallel around {part_name} left the rest on one process, "
                f"which sharded data would drift apart); its state_dict() keys are now 'module.{inner}.*' "
                f"where the multi-GPU original saved '{inner}.module.*' (load old checkpoints by hand)",
            )
        module_arg = None
        keep = []
        kinds = []  # (parameter, argument): DataParallel(module, device_ids, output_device, dim)
        for at, arg in enumerate(updated.args):
            keyword = arg.keyword.value if arg.keyword else None
            if keyword is None and at < len(_PARAMETERS):
                keyword = _PARAMETERS[at]
            if keyword not in _PARAMETERS:
                self.manual(original, f"DataParallel argument {keyword}= has no DDP twin")
                return updated
            kinds.append((keyword, arg))
            if keyword == "module":
                module_arg = arg.value
            elif keyword == "dim":  # (device_ids, output_device: the GPU list of the single DP process)
                keep.append(arg if arg.keyword else arg.with_changes(keyword=cst.Name("dim"), equal=P.TIGHT_EQUAL))
        if module_arg is None:
            self.manual(original, "DataParallel call without a module")
            return updated
        moved = m.matches(module_arg, P.DEVICE_MOVE) or self.already_moved(original_module, original)
        # this process's device only where the wrap moves the module (no unused
        # ``device = ...`` next to the script's own ``self.device``)
        device = None if moved else self.rank_name(original, "device")
        # local_rank only once the device is settled: no preamble for a wrap left as is
        local_rank = self.rank_name(original, "local_rank") if moved or device is not None else None
        if local_rank is None:
            self.manual(original, f"DataParallel left as is: {self.no_rank_device(original)}")
            return updated
        if not moved:
            module_arg = cst.Call(
                func=cst.Attribute(value=module_arg, attr=cst.Name("to")),
                args=[cst.Arg(cst.Name(device))],
            )
        frozen = self._frozen(original_module, original)
        if frozen:
            return self._frozen_model(original, updated, module_arg, frozen)
        ddp = self.object_alias("torch.nn.parallel", "DistributedDataParallel", N.DDP)
        torch_name = self.torch()
        template = cst.parse_expression(
            f"{ddp}(MODULE, device_ids=[{local_rank}] if {torch_name}.cuda.is_available() else None)"
        )
        assert isinstance(template, cst.Call)
        args = [template.args[0].with_changes(value=self.ddp_module(module_arg, original)), template.args[1]]
        for extra in keep:
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            args.append(extra.with_changes(comma=cst.MaybeSentinel.DEFAULT))
        dropped = self._dropped_outputs(original)
        dropped_inputs = self._dropped_inputs(original) if dropped is None else ()
        if (dropped is not None or dropped_inputs) and not any(
            a.keyword and a.keyword.value == "find_unused_parameters" for a in args
        ):
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            args.append(cst.Arg(keyword=cst.Name("find_unused_parameters"), value=cst.Name("True"),
                                equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))))
            if dropped is not None:
                self.note(
                    original,
                    f"find_unused_parameters=True: a training step drops some of the model's outputs (line {dropped}), "
                    "so the layers behind them get no gradient there -- DataParallel did not mind, DDP would stop at "
                    "the next step (\"Expected to have finished reduction\")",
                )
            else:
                self.note(original, A.dropped_inputs_note(*dropped_inputs), code="DDP204")
        self._converted.add(original)
        self.changed(original, "DataParallel -> DistributedDataParallel on this process's device")
        # (changes to the model after this wrap: wrap-after-changes moves the wrap past them)
        self._wrapped_lines.add(self.position(self.statement_of(original))[0])
        self._report_forward_past_the_wrapper(original)
        made = _with_comments(template.with_changes(args=args), updated, kinds)
        self._made_wraps.add(made)
        return made

    def _part_of_a_trained_model(self, call: cst.Call) -> Optional[Tuple[str, str, str]]:
        """(whole, part, why the whole cannot be wrapped instead or "") where this wrap is
        ``model.encoder = DataParallel(model.encoder)`` of a model that trains as a whole
        (``_analysis.partly_wrapped_models``, lint's DDP009; ``_analysis.whole_wrap_blocker``)."""
        return self._partial_wraps().get(self.position(self.statement_of(call))[0])

    def _partial_wraps(self) -> Dict[int, Tuple[str, str, str]]:
        """line of the wrap -> (whole, part, blocker) (see ``_part_of_a_trained_model``)."""
        if self._partial is None:
            src = self.ast_source
            imported = {
                alias: (f.params, f.attributes)
                for alias, f in A.imported_functions_by_alias(src, dict(self.role.imported_model_functions)).items()
            }
            self._partial = {
                a.lineno: (whole, part, A.whole_wrap_blocker(src, a, whole, imported, importable=not self.role.is_entry))
                for a, whole, part in A.partly_wrapped_models(src, N.DATA_PARALLEL)
            }
        return self._partial

    def _wrap_targets(self, call: cst.Call) -> List[str]:
        """The names the statement of this wrap assigns it to (``net = ...``)."""
        stmt = self.statement_of(call)
        if not isinstance(stmt, cst.SimpleStatementLine) or not isinstance(stmt.body[0], cst.Assign):
            return []
        return [P.dotted_name(target.target) for target in stmt.body[0].targets]

    def _dropped_outputs(self, call: cst.Call):
        """The line of a training step that drops some outputs of the model this
        wrap is assigned to (``A.discarded_outputs``), or None."""
        for name in self._wrap_targets(call):
            dropped = A.discarded_outputs(self.ast_source, name)
            if dropped:
                return dropped[0].lineno
        return None

    def _dropped_inputs(self, call: cst.Call) -> tuple:
        """(model, ``labels = None`` assignment) where a training step hands the model
        this wrap is assigned to an input it may set to None (``A.inputs_dropped_in_training``)."""
        for name in self._wrap_targets(call):
            dropped = A.inputs_dropped_in_training(
                self.ast_source, name, forward_elsewhere=self.role.program_forward_tests_none
            )
            if dropped:
                return (name, dropped[0])
        return ()

    def _unwraps_itself(self, wraps) -> bool:
        """The script takes the bare model where it may be wrapped
        (``model.module.state_dict() if hasattr(model, "module") else ...``, or
        ``isinstance(model, nn.DataParallel)``): its
        checkpoints never had the 'module.' prefix, wrapped or not."""
        names = {
            P.dotted_name(t.target)
            for stmt in wraps
            for assign in P.find(stmt, cst.Assign)
            for t in assign.targets
        } - {""}
        for call in self._type_tests():
            if m.matches(call.func, m.Name("hasattr")) and len(call.args) == 2:
                if P.dotted_name(call.args[0].value) in names and P.string_value(call.args[1].value) == "module":
                    return True
            # ``model.module if isinstance(model, nn.DataParallel) else model`` (the test
            # picks ``.module``, not only says which it is)
            if m.matches(call.func, m.Name("isinstance")) and len(call.args) == 2:
                wrapper, name = call.args[1].value, P.dotted_name(call.args[0].value)
                types = [e.value for e in wrapper.elements] if isinstance(wrapper, cst.Tuple) else [wrapper]
                test_of = self.parent(call)
                picked = (
                    test_of.body if isinstance(test_of, cst.IfExp) and test_of.test is call
                    else test_of.body if isinstance(test_of, cst.If) and test_of.test is call
                    else None
                )
                if (
                    name in names
                    and any(self.is_ref(t, N.DATA_PARALLEL | N.DDP) for t in types)
                    and picked is not None
                    and any(P.dotted_name(a) == f"{name}.module" for a in P.find(picked, cst.Attribute))
                ):
                    return True
        return False

    def _type_tests(self) -> List[cst.Call]:
        """The module's ``hasattr(x, ...)`` / ``isinstance(x, ...)`` calls, found once
        (asked for each wrap, a walk over every call grew with the square of the file)."""
        cached = getattr(self, "_type_test_calls", None)
        if cached is None or cached[0] is not self.module:
            cached = self._type_test_calls = (self.module, [
                call for call in self.module_calls
                if isinstance(call.func, cst.Name) and call.func.value in ("hasattr", "isinstance")
                and len(call.args) == 2
            ])
        return cached[1]

    # a frozen model (a teacher) ------------------------------------------------
    def _frozen(self, module: Optional[cst.BaseExpression], at: cst.Call) -> str:
        """The dotted name of ``module`` when it is frozen before the wrap --
        ``for p in teacher.parameters(): p.requires_grad = False`` or
        ``teacher.requires_grad_(False)`` earlier in the same function -- else ""."""
        name = P.dotted_name(module) if module is not None else ""
        if not name:
            return ""
        scope = self.enclosing_function(at) or self.module
        line = self.position(at)[0]
        if self._trainable_again(scope, name, line):
            return ""
        for loop in P.find(scope, cst.For):
            if not (
                m.matches(loop.iter, m.Call(func=m.Attribute(attr=m.Name("parameters"))))
                and P.dotted_name(loop.iter.func.value) == name
                and isinstance(loop.target, cst.Name)
                and self.position(loop)[0] < line
            ):
                continue
            param = loop.target.value
            for assign in P.find(loop.body, cst.Assign):
                if m.matches(assign.value, m.Name("False")) and any(
                    P.dotted_name(t.target) == f"{param}.requires_grad" for t in assign.targets
                ):
                    return name
            for call in P.find(loop.body, cst.Call):
                if _requires_grad_false(call) and P.dotted_name(call.func.value) == param:
                    return name
        for call in P.find(scope, cst.Call):
            if _requires_grad_false(call) and P.dotted_name(call.func.value) == name and self.position(call)[0] < line:
                return name
        return ""

    def _trainable_again(self, scope: cst.CSTNode, name: str, line: int) -> bool:
        """After the freeze some parameters of ``name`` may train after all: a layer
        added (``model.fc = nn.Linear(...)``, ``add_module``), ``requires_grad``
        set back, or its parameters handed on after the wrap (to an optimizer) --
        then it is a partly frozen model, which DDP wraps as usual."""
        def owned(node) -> bool:
            dotted = P.dotted_name(node)
            return dotted == name or dotted.startswith(name + ".")

        for assign in P.find(scope, cst.Assign):
            if any(owned(t.target) and P.dotted_name(t.target) != name for t in assign.targets):
                return True  # model.fc = nn.Linear(...)
            if m.matches(assign.value, m.Name("True")) and any(
                P.dotted_name(t.target).endswith(".requires_grad") for t in assign.targets
            ):
                return True
        for call in P.find(scope, cst.Call):
            func = call.func
            if not isinstance(func, cst.Attribute):
                continue
            if func.attr.value in ("add_module", "register_module") and owned(func.value):
                return True
            if func.attr.value == "requires_grad_" and not _requires_grad_false(call):
                return True
            if func.attr.value in ("parameters", "named_parameters") and owned(func.value):
                if self.position(call)[0] > line and self._handed_to_an_optimizer(call):
                    return True  # optimizer(model.parameters()) after the wrap: it trains
        return False

    def _handed_to_an_optimizer(self, call: cst.Call) -> bool:
        """The parameters of ``call`` go to whatever consumes them first -- through
        ``list()``, ``filter()``, ``+`` and parameter-group lists and dicts: an
        optimizer, or a call of the project's (a helper may build one) -- not
        iterated in a loop or a comprehension (``sum(p.sum() for p in ...)`` for a log)."""
        for anc in self.ancestors(call):
            if isinstance(anc, (cst.Arg, cst.BinaryOperation, cst.List, cst.Tuple, cst.Element, cst.Dict, cst.DictElement)):
                continue
            if isinstance(anc, cst.Call):
                names = self.qnames(anc.func)
                if names & _PASSING_ON:
                    continue
                return not names & _CONSUMING
            return False  # iterated (a for, a comprehension), or bound to a name
        return False

    def _frozen_model(
        self, original: cst.Call, updated: cst.Call, module_arg: cst.BaseExpression, name: str
    ) -> cst.BaseExpression:
        """DDP refuses a module none of whose parameters requires a gradient (there
        is nothing to average): the frozen model just goes on this process's device.
        Code that relies on the wrapper (``name.module``, its ``state_dict()`` keys)
        is left for a human instead."""
        uses = [
            a for a in P.find(self.module, cst.Attribute)
            if P.dotted_name(a.value) == name and a.attr.value in ("module", "state_dict")
        ]
        if uses:
            self.manual(
                original,
                f"{name} is frozen (no parameter requires a gradient): DDP refuses such a module, so "
                f"it should not be wrapped -- but the code uses {name}.module or its state_dict() "
                "keys; drop the wrap and those by hand",
            )
            self._frozen_left.add(original)  # (no DDP needed: the program is data-parallel without it)
            return updated
        self._converted.add(original)
        self.changed(
            original,
            f"DataParallel around the frozen {name} -> {name} on this process's device: DDP refuses "
            "a module without trainable parameters (nothing to average); each process runs its own copy",
        )
        stmt = self.statement_of(original)
        block = self.parent(stmt)
        owner = self.parent(block) if isinstance(block, cst.IndentedBlock) else block
        if (
            isinstance(owner, (cst.FunctionDef, cst.Module))
            and len(block.body) > 1
            and m.matches(stmt, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget()])]))
            and P.dotted_name(module_arg)
            and P.dotted_name(stmt.body[0].targets[0].target) == P.dotted_name(module_arg)
            and _unmoved(stmt.body[0].value) is original
        ):
            # ``teacher = teacher``: nothing left to do (in a function's or the module's
            # own body only: a guard around it takes its wraps out itself)
            self.replace_statement(stmt, [])
        return module_arg

    def _report_forward_past_the_wrapper(self, wrap: cst.Call) -> None:
        """``model.module.encoder(x)`` in a training step of the model this wrap
        (now DDP) is assigned to (lint's DDP308): DataParallel only lost its
        multi-GPU split there; DDP does not average those gradients."""
        assign = self.parent(wrap)
        while isinstance(assign, (cst.Attribute, cst.Call)):  # DataParallel(model).cuda()
            assign = self.parent(assign)
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1):
            return
        name = P.dotted_name(assign.targets[0].target)
        for stmt, what in A.forward_past_the_wrapper(self.ast_source, {name} if name else set()):
            node = self.statement_at(stmt.lineno)
            if node is not None and node not in self._past_wrapper_reported:
                self._past_wrapper_reported.add(node)
                self.manual(
                    node,
                    f"{what}(...) runs the model past its DDP wrapper in a training step: DDP does "
                    "not average these gradients and the ranks drift apart; call the wrapped model "
                    "instead (return the parts you need from its forward)",
                    code="DDP308",
                )

    def _saves_wrapped(self, call: cst.Call) -> bool:
        """``torch.save(model, ...)`` of a model whose wrap was converted."""
        if not (self.is_call(call, N.TORCH_SAVE) and call.args and call.args[0].keyword is None):
            return False
        if self._saves is None:
            self._saves = A.whole_model_saves(self.ast_source, N.DATA_PARALLEL)
        wrap = self._saves.get(self.position(call)[0])
        return wrap is not None and wrap[0] in self._wrapped_lines and _holds_the_model(call.args[0].value, wrap[1])

    def _report_helper_save(self, call: cst.Call) -> None:
        """``save_model(model, path)`` after a converted wrap, where ``save_model``
        pickles the model it gets: reported at the call (the helper may be defined
        above the wrap, or take other models too)."""
        if not isinstance(call.func, cst.Name) or not self._wrapped_lines:
            return
        if self._helper_saves is None:
            self._helper_saves = A.helper_whole_model_saves(self.ast_source, N.DATA_PARALLEL)
        found = self._helper_saves.get(self.position(call)[0])
        if found is None or found[0] not in self._wrapped_lines or found[2] != call.func.value:
            return
        _, name, helper, param = found
        self.manual(
            call,
            f"{helper}() pickles the whole model it gets (torch.save({param}, ...)): {name} is now "
            "a DDP wrapper, which cannot be loaded without a process group; save "
            f"{name}.module (code that loads the file then gets the model itself, no .module)",
        )

    def _save_module(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        """``torch.save(model, path)`` pickled the DataParallel wrapper, which loads
        anywhere; a pickled DDP wrapper needs a process group to load.  The wrapped
        module is saved instead."""
        wrap = self._saves[self.position(original)[0]]
        name = wrap[1]
        first = updated.args[0]
        self.changed(
            original,
            f"torch.save({name}) -> torch.save({name}.module): a pickled DDP wrapper cannot be "
            "loaded without a process group; code that loads this file now gets the model "
            "itself (no .module)",
        )
        return updated.with_changes(args=[first.with_changes(value=_bare(first.value, name)), *updated.args[1:]])


    def _isinstance(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if not self.role.in_program:
            return updated  # a library's own DataParallel check is about DataParallel
        classes = original.args[1].value
        elements = classes.elements if isinstance(classes, cst.Tuple) else None
        if elements is None:
            if not self.is_ref(classes, N.DATA_PARALLEL) or self._hand_made:
                return updated
            ddp = self.object_alias("torch.nn.parallel", "DistributedDataParallel", N.DDP)
            self.changed(original, "isinstance check tests for DistributedDataParallel")
            new_second = updated.args[1].with_changes(value=cst.parse_expression(ddp))
            return updated.with_changes(args=[updated.args[0], new_second])
        if self._hand_made or not any(
            self.is_ref(e.value, N.DATA_PARALLEL) for e in elements
        ):
            return updated
        has_ddp = any(self.is_ref(e.value, N.DDP) for e in elements)
        ddp = self.object_alias("torch.nn.parallel", "DistributedDataParallel", N.DDP)
        new_elements = []
        for orig_el, el in zip(elements, updated.args[1].value.elements):
            if self.is_ref(orig_el.value, N.DATA_PARALLEL):
                if has_ddp:
                    continue
                el = el.with_changes(value=cst.parse_expression(ddp))
                has_ddp = True
            new_elements.append(el)
        self.changed(original, "isinstance check tests for DistributedDataParallel")
        if len(new_elements) == 1:
            value = new_elements[0].value
        else:
            new_elements[-1] = new_elements[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            value = updated.args[1].value.with_changes(elements=new_elements)
        return updated.with_changes(args=[updated.args[0], updated.args[1].with_changes(value=value)])

    # if torch.cuda.device_count() > 1: model = DataParallel(model) ------------
    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> Union[cst.If, cst.FlattenSentinel]:
        """Take the wrap out of a GPU-only condition; the rest stays under it.

        ``if cond: A; wrap; B`` -> ``if cond: A; B`` then ``wrap``; when only an
        ``else`` remains, ``if not cond: <else>``; device moves of the model in
        the ``else`` are dropped (the wrap moves it).
        """
        if P.is_main_guard(original_node):
            return updated_node
        body = original_node.body.body
        # every wrap under the condition (a GAN wraps its generator and its discriminator)
        indices = [i for i, s in enumerate(body) if isinstance(s, cst.SimpleStatementLine) and self._wraps_here(s)]
        if not indices and self._wraps_here(original_node.body):
            # the wrap was taken out of an inner switch (``if "cuda" in device: ...
            # if args.dp: net = DataParallel(net)``): it now stands in this block
            made = [
                i for i, s in enumerate(updated_node.body.body)
                if isinstance(s, cst.SimpleStatementLine) and any(c in self._made_wraps for c in P.find(s, cst.Call))
            ]
            if made:
                body, indices = list(updated_node.body.body), made
        index = indices[0] if indices else None
        if index is None:
            if (
                self._wraps_here(original_node.body)
                or (original_node.orelse is not None and self._wraps_here(original_node.orelse))
            ) and not self._in_a_condition(original_node):
                self.manual(original_node, _CONDITIONAL_WRAP)
            return updated_node
        parent = self.parent(original_node)
        is_elif = isinstance(parent, cst.If) and parent.orelse is original_node
        if is_elif or not P.is_gpu_guard(self, original_node.test) or (
            original_node.orelse is not None and not isinstance(original_node.orelse, cst.Else)
        ):
            # (an ``elif``: the wrap cannot be taken out of one branch of a chain --
            # the chain's head reports it)
            if not self._in_a_condition(original_node):
                self.manual(original_node, _CONDITIONAL_WRAP)
            return updated_node
        updated_body = list(updated_node.body.body)
        wraps = [updated_body[i] for i in indices]
        new_body = [stmt for i, stmt in enumerate(updated_body) if i not in indices]
        after_wrap = [stmt for i, stmt in enumerate(body) if i > index and i not in indices]
        if any("module" in P.names_in(s) for s in after_wrap):
            self.manual(
                original_node,
                "code after the DataParallel wrap uses .module under the GPU condition: "
                "move the wrap out of the condition by hand",
            )
            return updated_node
        else_body = []
        if updated_node.orelse is not None:
            else_body = [
                s for s in updated_node.orelse.body.body
                if not self._device_move(s) or _commented_pass(s)  # (a TODO there stays)
            ]
        lead = list(updated_node.leading_lines)
        self.changed(
            original_node,
            "the DDP wrap is taken out of the GPU-only condition: every process wraps (GPU or CPU)",
        )
        self._note_prefix(original_node, wraps)
        # the comment on the condition's line goes with the wrap, above it
        header = updated_node.body.header if isinstance(updated_node.body, cst.IndentedBlock) else None
        said = [cst.EmptyLine(comment=header.comment)] if header is not None and header.comment else []
        if not new_body and all(_commented_pass(s) for s in else_body):
            # ``else: pass  # TODO`` alone: no ``if not cond: pass`` -- its comments go above the wrap
            said += [cst.EmptyLine(comment=c) for s in else_body for c in _comments_of(s)]
            else_body = []
        if not new_body and not else_body:
            first = wraps[0].with_changes(leading_lines=[*lead, *said, *wraps[0].leading_lines])
            return cst.FlattenSentinel([first, *wraps[1:]])
        if not new_body:
            test = updated_node.test
            if isinstance(test, (cst.Comparison, cst.BooleanOperation, cst.IfExp)) and not test.lpar:
                test = test.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
            kept = updated_node.with_changes(
                test=cst.UnaryOperation(operator=cst.Not(), expression=test),
                body=updated_node.orelse.body.with_changes(body=else_body),
                orelse=None,
            )
        else:
            orelse = updated_node.orelse
            if orelse is not None:
                orelse = orelse.with_changes(body=orelse.body.with_changes(body=else_body)) if else_body else None
            kept = updated_node.with_changes(
                body=updated_node.body.with_changes(body=new_body), orelse=orelse
            )
        if new_body:
            said = []  # (the condition stays, with its comment)
        moved = [
            w.with_changes(leading_lines=[*(said if i == 0 else []), *(l for l in w.leading_lines if l.comment)])
            for i, w in enumerate(wraps)
        ]  # (with the comment lines above each wrap)
        return cst.FlattenSentinel([kept, *moved])

    def _note_prefix(self, at: cst.CSTNode, wraps) -> None:
        if ("state_dict" in self.module_code or self.role.program_state_dict) and not self._unwraps_itself(wraps):
            self.note(
                at,
                "the original wrapped only when it saw several GPUs, so its checkpoints from "
                "CPU or 1-GPU runs have no 'module.' prefix; the converted script always "
                "wraps, like a multi-GPU run (load old ones with "
                "torch.nn.modules.utils.consume_prefix_in_state_dict_if_present)",
            )

    # model = DataParallel(model) if torch.cuda.device_count() > 1 else model ---
    def leave_IfExp(self, original_node: cst.IfExp, updated_node: cst.IfExp) -> cst.BaseExpression:
        """The one-line form of the GPU-only wrap: every process wraps, so the
        expression becomes the wrap.  Only when the other branch is the same
        model (or it moved to a device); anything else is left for a human."""
        sides = [(original_node.body, updated_node.body, original_node.orelse),
                 (original_node.orelse, updated_node.orelse, original_node.body)]
        for wrap, converted, other in sides:
            wrap = _unmoved(wrap)  # DataParallel(model).cuda(): the move is folded into the wrap
            if wrap not in self._converted:
                continue
            module = next((a.value for a in wrap.args if a.keyword is None or a.keyword.value == "module"), None)
            name = P.dotted_name(_unmoved(module)) if module is not None else ""
            same = bool(name) and P.dotted_name(_unmoved(other)) == name
            if not (same and P.is_gpu_guard(self, original_node.test)):
                self.manual(original_node, _CONDITIONAL_WRAP)
                return updated_node
            self.changed(
                original_node,
                "the DDP wrap is taken out of the GPU-only condition: every process wraps (GPU or CPU)",
            )
            statement = next((a for a in self.ancestors(original_node) if isinstance(a, cst.SimpleStatementLine)), wrap)
            self._note_prefix(original_node, [statement])
            return converted.with_changes(
                lpar=[*original_node.lpar, *converted.lpar], rpar=[*converted.rpar, *original_node.rpar]
            )
        if self._wraps_here(original_node.body) or self._wraps_here(original_node.orelse):
            self.manual(original_node, _CONDITIONAL_WRAP)
        return updated_node

    def _in_a_condition(self, node: cst.If) -> bool:
        """``node`` is inside another ``if`` (or is an ``elif``) of the same function
        that reports the conditional wrap itself: it is reported once, there.  (An
        enclosing GPU guard whose own wrap is taken out reports nothing.)"""
        for anc in self.ancestors(node):
            if anc is node:
                continue
            if isinstance(anc, (cst.FunctionDef, cst.ClassDef, cst.Module)):
                return False
            if isinstance(anc, cst.If) and not P.is_main_guard(anc) and self._reports_its_wrap(anc):
                return True
        return False

    def _reports_its_wrap(self, guard: cst.If) -> bool:
        """leave_If reports ``guard`` (no wrap of its own to take out of it)."""
        direct = any(
            isinstance(s, cst.SimpleStatementLine)
            and any(self.is_call(c, N.DATA_PARALLEL) for c in P.find(s, cst.Call))
            for s in guard.body.body
        )
        elif_ = guard.orelse is not None and not isinstance(guard.orelse, cst.Else)
        return not direct or not P.is_gpu_guard(self, guard.test) or elif_

    def _wraps_here(self, block: cst.CSTNode) -> bool:
        return any(call in self._converted for call in P.find(block, cst.Call))

    def _device_move(self, stmt: cst.BaseStatement) -> bool:
        move = P.DEVICE_MOVE
        return m.matches(
            stmt,
            m.SimpleStatementLine(
                body=[m.Expr(value=move) | m.Assign(value=move) | m.Pass()]
            ),
        )


_CONDITIONAL_WRAP = (
    "DataParallel is wrapped only under this condition: under DDP every process must wrap; "
    "move the wrap out of it by hand"
)

#: Synchronized-BatchNorm-PyTorch's DataParallel helpers (``sync_batchnorm.replicate``)
def _holds_the_model(saved: cst.BaseExpression, name: str) -> bool:
    """(``_analysis.pickles_whole``, on the LibCST node of the same expression)"""
    if P.dotted_name(saved) == name:
        return True
    if isinstance(saved, cst.Dict):
        return any(isinstance(e, cst.DictElement) and _holds_the_model(e.value, name) for e in saved.elements)
    if isinstance(saved, (cst.List, cst.Tuple)):
        return any(isinstance(e, cst.Element) and _holds_the_model(e.value, name) for e in saved.elements)
    if isinstance(saved, cst.IfExp):
        return {P.dotted_name(saved.body), P.dotted_name(saved.orelse)} == {name, f"{name}.module"}
    return False


def _bare(saved: cst.BaseExpression, name: str) -> cst.BaseExpression:
    """``saved`` with the model in it replaced by ``name.module``: ``net`` ->
    ``net.module``, ``{"net": net}`` -> ``{"net": net.module}``, ``net.module if
    use_cuda else net`` -> ``net.module`` (every process wraps now)."""
    if P.dotted_name(saved) == name:
        return cst.Attribute(value=saved, attr=cst.Name("module"))
    if isinstance(saved, cst.IfExp) and _holds_the_model(saved, name):
        inner = saved.body if P.dotted_name(saved.body) == f"{name}.module" else saved.orelse
        return inner.with_changes(lpar=saved.lpar, rpar=saved.rpar)
    if isinstance(saved, cst.Dict):
        return saved.with_changes(elements=[
            e.with_changes(value=_bare(e.value, name)) if isinstance(e, cst.DictElement) else e
            for e in saved.elements
        ])
    if isinstance(saved, (cst.List, cst.Tuple)):
        return saved.with_changes(elements=[
            e.with_changes(value=_bare(e.value, name)) if isinstance(e, cst.Element) else e
            for e in saved.elements
        ])
    return saved


#: calls that hand parameters on, and calls that use them up (no optimizer there)
_PASSING_ON = frozenset({"builtins.list", "builtins.filter", "builtins.tuple", "itertools.chain"})
_CONSUMING = frozenset({"builtins.sum", "builtins.len", "builtins.any", "builtins.all", "builtins.max", "builtins.min", "builtins.print"})
_DATA_PARALLEL_ONLY = frozenset({"patch_replication_callback"})  # (DataParallelWithCallback: DDP009)


#: DataParallel's parameters, in order
_PARAMETERS = ("module", "device_ids", "output_device", "dim")


def _with_comments(call: cst.Call, old: cst.Call, kinds) -> cst.Call:
    """``call`` (the DDP wrap, written on one line) with the comments of ``old``'s
    arguments carried over, one argument per line: each stays after the argument it
    followed (``device_ids``'s after the new ``device_ids``); those of a dropped
    argument (``output_device``) become own-line comments where it was.  Unchanged
    when ``old`` has none."""
    head, head_lines = _gap_comments(old.whitespace_before_args)
    trailing = {}  # parameter -> (trailing comment, own-line comments after it)
    previous = None
    for name, arg in kinds:
        first, rest = None, []
        for gap in _arg_gaps(arg, keep_value=name in ("module", "dim")):
            gap_first, gap_rest = _gap_comments(gap)
            if first is None and gap_first is not None and name != "output_device":
                first = gap_first
            else:
                rest += [gap_first] if gap_first is not None else []
            rest += gap_rest
        if name == "output_device":  # dropped: its comments stay where it was
            if previous is None:
                head_lines += rest
            else:
                trailing[previous] = (trailing[previous][0], trailing[previous][1] + rest)
            continue
        trailing[name] = (first, rest)
        previous = name
    if head is None and not head_lines and not any(t or r for t, r in trailing.values()):
        return call
    names = ["module", "device_ids", *(["dim"] if any(n == "dim" for n, _ in kinds) else [])]
    args = []
    for name, arg in zip(names, call.args):
        comment, after = trailing.get(name, (None, []))
        last = name == names[-1]
        args.append(
            arg.with_changes(
                whitespace_after_arg=cst.SimpleWhitespace(""),
                comma=cst.Comma(whitespace_after=_line_break(comment, after, "" if last else "    ")),
            )
        )
    return call.with_changes(whitespace_before_args=_line_break(head, head_lines, "    "), args=args)


def _arg_gaps(arg: cst.Arg, keep_value: bool):
    """The whitespace nodes of ``arg`` where its comments are (those inside a value
    that stays, or around the ``=`` of a keyword that stays, go with it)."""
    found = []

    class Gaps(cst.CSTVisitor):
        def on_visit(self, node: cst.CSTNode) -> bool:
            if keep_value and (node is arg.value or node is arg.equal or node is arg.keyword):
                return False
            if isinstance(node, (cst.ParenthesizedWhitespace, cst.TrailingWhitespace, cst.EmptyLine)):
                found.append(node)
                return False
            return True

    arg.visit(Gaps())
    return found


def _gap_comments(gap) -> Tuple[Optional[str], list]:
    """(the comment at the end of the line the gap starts on, own-line comments in it)."""
    if isinstance(gap, cst.ParenthesizedWhitespace):
        first = gap.first_line.comment.value if gap.first_line.comment else None
        return first, [line.comment.value for line in gap.empty_lines if line.comment]
    if isinstance(gap, cst.TrailingWhitespace):
        return (gap.comment.value if gap.comment else None), []
    if isinstance(gap, cst.EmptyLine):
        return None, [gap.comment.value] if gap.comment else []
    return None, []


def _line_break(comment: Optional[str], lines: list, indent: str) -> cst.ParenthesizedWhitespace:
    """A line end (with ``comment``), own-line ``lines``, then ``indent`` past the statement's."""
    return cst.ParenthesizedWhitespace(
        first_line=cst.TrailingWhitespace(
            whitespace=cst.SimpleWhitespace("  " if comment else ""),
            comment=cst.Comment(comment) if comment else None,
        ),
        empty_lines=[
            cst.EmptyLine(indent=True, whitespace=cst.SimpleWhitespace("    "), comment=cst.Comment(text))
            for text in lines
        ],
        indent=True,
        last_line=cst.SimpleWhitespace(indent),
    )


def _commented_pass(stmt: cst.BaseStatement) -> bool:
    """``pass`` with a comment on its line or above it."""
    return (
        m.matches(stmt, m.SimpleStatementLine(body=[m.Pass()]))
        and (any(line.comment for line in stmt.leading_lines) or stmt.trailing_whitespace.comment is not None)
    )


def _comments_of(stmt: cst.SimpleStatementLine) -> List[cst.Comment]:
    """The comments above a simple statement and on its line."""
    found = [line.comment for line in stmt.leading_lines if line.comment]
    return found + ([stmt.trailing_whitespace.comment] if stmt.trailing_whitespace.comment else [])


def _parenthesized_as(old: cst.BaseExpression, new: cst.BaseExpression) -> cst.BaseExpression:
    """``new`` in the parentheses that stood around ``old`` (``model = (  # comment``
    around a wrap), where it has none of its own: the comments in them stay."""
    if new is old or not old.lpar or new.lpar:
        return new
    return new.with_changes(lpar=old.lpar, rpar=old.rpar)


def _unmoved(node: cst.BaseExpression) -> cst.BaseExpression:
    """``model`` of ``model.to(device)`` / ``model.cuda()``."""
    while isinstance(node, cst.Call) and m.matches(node, P.DEVICE_MOVE):
        node = node.func.value
    return node


def _requires_grad_false(call: cst.Call) -> bool:
    """``x.requires_grad_(False)``."""
    return m.matches(
        call,
        m.Call(func=m.Attribute(attr=m.Name("requires_grad_")), args=[m.Arg(value=m.Name("False"), keyword=None)]),
    ) or m.matches(
        call,
        m.Call(func=m.Attribute(attr=m.Name("requires_grad_")), args=[m.Arg(value=m.Name("False"), keyword=m.Name("requires_grad"))]),
    )


def _loaded_back_message(name: str) -> str:
    """(Shared with module-access.)"""
    return (
        f"torch.save({name}) pickles the DDP wrapper, and the script loads the file back into "
        f"{name}, where the code after it expects the wrapper: left as it is (loading it needs a "
        f"process group); for a file that loads anywhere save {name}.module and wrap the loaded "
        "model again, or save a state_dict"
    )


#: what shows a message: print, logging and logger methods, click.echo, tqdm.write
_OUTPUT_CALLS = frozenset({"print", "info", "debug", "warning", "warn", "error", "log", "echo", "write"})


def _messages_naming_data_parallel(src: A.Source) -> List[ast.AST]:
    """The string constants of output calls that name DataParallel (``logger.info(
    "Using %d GPUs with DataParallel", n)``): after the conversion they say what the
    program no longer does."""
    if "DataParallel" not in src.text:
        return []
    found = []
    for call in src.calls:
        if A.last_name(call.func) not in _OUTPUT_CALLS:
            continue
        for arg in call.args:
            if any(isinstance(n, ast.Constant) and isinstance(n.value, str) and A.DATA_PARALLEL_WORD.search(n.value)
                   for n in ast.walk(arg)):
                found.append(call)
                break
    return found
