"""DDP005 rank-device: one device per process instead of hard-wired GPUs.

Under DDP every process drives one GPU, the one at index ``LOCAL_RANK`` on its
node, and the converted script must also run on a CPU-only machine (gloo).  So:

* ``x.cuda()``, ``x.cuda(0)``, ``x.cuda(args.gpu)`` become ``x.to(device)``
  (``non_blocking=`` is kept);
* ``device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")`` and
  ``torch.device("cuda")`` become
  ``torch.device(f"cuda:{local_rank}" if <the same test> else "cpu")``; a device
  kept as a string stays a string (``"cuda:0"`` -> ``f"cuda:{local_rank}" if ...
  else "cpu"``; a bare ``"cuda"`` already means this process's GPU once the setup
  has called ``set_device``, it only gets a CPU fallback when it had none), so
  ``device == "cpu"`` and ``autocast(device_type=device)`` keep working;
* ``.to("cuda:0")``, ``device="cuda"`` and ``map_location="cuda:0"`` arguments use
  ``device``;
* ``torch.cuda.set_device(...)`` calls are dropped: the process-group setup calls
  it with the local rank.

``x.cuda(1)`` (a second GPU on purpose: model parallelism) is reported, not changed.

Example::

    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    inputs = inputs.cuda(non_blocking=True)

becomes::

    device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    inputs = inputs.to(device, non_blocking=True)
"""

from __future__ import annotations

import re
from typing import Optional, Set, Union

import libcst as cst
import libcst.matchers as m

from . import _analysis as A
from . import _names as N
from . import _patterns as P
from ._base import FileRole, Transform


class RankDevice(Transform):
    CODE = "DDP005"
    NAME = "rank-device"
    DESCRIPTION = "Place model and batches on this process's device, not a hard-wired GPU."
    TRIGGERS = ("cuda", "device", "CUDA_VISIBLE_DEVICES", "local_rank", "local-rank", "gpu")

    @classmethod
    def applies_to(cls, role: FileRole) -> bool:
        return role.in_program and not role.already_distributed

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        #: functions (or the module) that place things on a second GPU on purpose
        self._multi_gpu: Set[cst.CSTNode] = set()
        self._switch_noted = False

    def visit_Module(self, node: cst.Module) -> None:
        for sub in P.find(node, cst.Call, cst.SimpleString):
            if isinstance(sub, cst.Call):
                if m.matches(sub.func, m.Attribute(attr=m.Name("cuda"))) and sub.args:
                    value = sub.args[0].value
                    if sub.args[0].keyword is None and isinstance(value, cst.Integer) and value.value != "0":
                        self._mark_multi_gpu(sub)
                elif m.matches(sub.func, m.Attribute(attr=m.Name("to"))) and sub.args and _other_gpu_of_a_list(
                    sub.args[0].value
                ):
                    self._mark_multi_gpu(sub)  # .to(gpus[1]): model parallelism
            else:
                value = P.string_value(sub) or ""
                if value.startswith("cuda:") and value[5:].isdigit() and value[5:] != "0":
                    self._mark_multi_gpu(sub)
        self._report_gpu_indices()

    def _report_gpu_indices(self) -> None:
        """``device = 0; main(device)`` ... ``model.to(gpu_id)``: an integer GPU index
        used as the device (``_analysis.literal_gpu_indices``, lint's DDP005).
        Reported: the name may be an index elsewhere too (``device_ids=[gpu_id]``,
        log lines), so rewriting its value is for a human."""
        for assign, name, index in A.literal_gpu_indices(self.ast_source):
            stmt = self.statement_at(assign.lineno)
            if isinstance(stmt, cst.SimpleStatementLine) and not self._in_multi_gpu(stmt):
                self.manual(
                    stmt,
                    f"GPU {index} chosen by its index ({name} = {index}, used as the device): every "
                    f"process would use that GPU; give it this process's device instead "
                    f"(int(os.environ['LOCAL_RANK']), or a CPU fallback when there is no GPU)",
                )

    def _mark_multi_gpu(self, node: cst.CSTNode) -> None:
        owner = self.enclosing_function(node) or self.module
        if owner not in self._multi_gpu:
            self._multi_gpu.add(owner)
            self.manual(
                node,
                "this code puts tensors on a second GPU on purpose (model parallelism?): "
                "its device placement is left as is; give each process its own GPUs by hand",
            )

    def _in_multi_gpu(self, node: cst.CSTNode) -> bool:
        return (self.enclosing_function(node) or self.module) in self._multi_gpu

    # os.environ["CUDA_VISIBLE_DEVICES"] = ... ------------------------------------
    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            if self._visible_devices(target.target):
                self._visible_devices_set(node)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if (
            isinstance(func, cst.Attribute)
            and func.attr.value == "setdefault"
            and self.is_ref(func.value, {"os.environ"})
            or self.is_ref(func, {"os.putenv"})
        ) and node.args and P.string_value(node.args[0].value) == "CUDA_VISIBLE_DEVICES":
            self._visible_devices_set(node)

    def _visible_devices(self, target: cst.CSTNode) -> bool:
        return (
            isinstance(target, cst.Subscript)
            and self.is_ref(target.value, {"os.environ"})
            and len(target.slice) == 1
            and isinstance(target.slice[0].slice, cst.Index)
            and P.string_value(target.slice[0].slice.value) == "CUDA_VISIBLE_DEVICES"
        )

    def _visible_devices_set(self, node: cst.CSTNode) -> None:
        # GPUs "2,3" for two processes still work (LOCAL_RANK indexes into them);
        # the usual default "0" leaves rank 1 without a GPU: a human decides
        self.manual(
            node,
            "the script sets CUDA_VISIBLE_DEVICES: under torchrun every process sees only "
            "these GPUs and LOCAL_RANK indexes into them (fewer GPUs than processes: "
            "set_device fails); remove it and choose the GPUs on the command line "
            "(CUDA_VISIBLE_DEVICES=0,1 torchrun --nproc_per_node=2 ...)",
        )

    # x.cuda(...) / x.to("cuda:0") / device="cuda" ------------------------------
    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self._in_multi_gpu(original_node):
            return updated_node
        func = updated_node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "cuda" and not self.qnames(
            original_node.func
        ).intersection({"torch.cuda"}):
            return self._cuda_call(original_node, updated_node)
        if self.is_call(original_node, N.TORCH_DEVICE):
            return updated_node
        self._gpu_option(original_node)
        if _local_rank_option(original_node):
            return self._local_rank_default(original_node, updated_node)
        return self._device_args(original_node, updated_node)

    def _local_rank_default(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        """``parser.add_argument("--local_rank", type=int, default=0)``: the deprecated
        ``torch.distributed.launch`` passed it; torchrun sets ``LOCAL_RANK`` instead, so
        it would stay at its default in every process.  The default reads the variable
        (the option keeps working for launchers that pass it)."""
        index = next(
            (i for i, a in enumerate(updated.args) if a.keyword is not None and a.keyword.value == "default"), None
        )
        if index is None:
            self.manual(
                original,
                "--local_rank comes from the deprecated torch.distributed.launch; torchrun sets "
                "LOCAL_RANK in the environment instead: read it from there",
            )
            return updated
        default = updated.args[index]
        if "LOCAL_RANK" in self.module.code_for_node(default.value):
            return updated
        os_name = self.module_alias("os", "os")
        old = self.module.code_for_node(default.value)
        self.changed(
            original,
            "--local_rank defaults to LOCAL_RANK from the environment: torchrun sets the "
            "variable, not the argument (torch.distributed.launch's)",
        )
        if _int_literal(default.value):
            new_value = cst.parse_expression(f'int({os_name}.environ.get("LOCAL_RANK", {old}))')
        else:  # ``default=None``, a name: kept as it is without torchrun
            new_value = cst.parse_expression(
                f'int({os_name}.environ["LOCAL_RANK"]) if "LOCAL_RANK" in {os_name}.environ else {old}'
            )
        args = list(updated.args)
        args[index] = default.with_changes(value=new_value)
        return updated.with_changes(args=args)

    def _gpu_option(self, call: cst.Call) -> None:
        """``parser.add_argument("--gpu-ids", ...)``: that option no longer picks GPUs."""
        flag = _option_flag(call)
        if flag.lstrip("-").replace("-", "_") in _GPU_OPTIONS:
            self.note(
                call,
                f"{flag} no longer chooses the GPUs: torchrun starts one process per GPU "
                "(--nproc_per_node) and each uses the GPU of its LOCAL_RANK; restrict them "
                "with CUDA_VISIBLE_DEVICES",
            )

    def _cuda_call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        keep = []
        for arg in updated.args:
            if arg.keyword is not None and arg.keyword.value == "non_blocking":
                keep.append(arg.with_changes(comma=cst.MaybeSentinel.DEFAULT))
            elif arg.keyword is None or arg.keyword.value == "device":
                continue
            else:
                self.manual(original, "unexpected arguments to .cuda(): place it by hand")
                return updated
        device = self.rank_name(original, "device")
        if device is None:
            self.manual(original, f".cuda() left as is: {self.no_rank_device(original)}")
            return updated
        if original.args and original.args[0].keyword is None:
            self.explicit_gpu_note(original.args[0].value)
        self.changed(original, f".cuda() -> .to({device}): this process's device")
        assert isinstance(updated.func, cst.Attribute)
        args = [cst.Arg(cst.Name(device)), *keep]
        args = [a.with_changes(comma=cst.MaybeSentinel.DEFAULT) for a in args]
        moved = updated.with_changes(func=updated.func.with_changes(attr=cst.Name("to")))
        if not updated.args:  # ``.cuda(\n)``: in its layout
            return P.append_arg(moved.with_changes(args=[]), args[0])
        return moved.with_changes(args=_commas(args))

    def _device_args(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        is_to = m.matches(original.func, m.Attribute(attr=m.Name("to")))
        new_args = list(updated.args)
        changed = False
        for index, (orig_arg, arg) in enumerate(zip(original.args, updated.args)):
            keyword = arg.keyword.value if arg.keyword is not None else None
            positional_to = is_to and keyword is None and index == 0
            if not (positional_to or keyword in ("device", "map_location")):
                continue
            index_of_gpu = positional_to and _gpu_index(orig_arg.value)  # net.to(opt.gpu_ids[0])
            if not index_of_gpu and (not P.is_device_spec(self, orig_arg.value) or P.is_rank_device(self, orig_arg.value)):
                continue
            device = self.rank_name(original, "device")
            if device is None:
                self.manual(original, f"hard-wired GPU left as is: {self.no_rank_device(original)}")
                continue
            new_args[index] = arg.with_changes(value=cst.Name(device))
            changed = True
            if index_of_gpu:
                self.explicit_gpu_note(orig_arg.value)
            elif isinstance(orig_arg.value, cst.IfExp):  # .to("cuda:%d" % gpu if ... else "cpu")
                self.explicit_gpu_note(orig_arg.value.body)
            self.changed(orig_arg, f"hard-wired GPU -> {device}: this process's device")
        return updated.with_changes(args=new_args) if changed else updated

    # device = torch.device("cuda:0" ...) ------------------------------------
    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        """Per-rank device, keeping its type: a ``torch.device`` stays one, a string
        stays a string (``device == "cpu"``, ``autocast(device_type=device)`` and
        friends keep working)."""
        targets = [t.target for t in original_node.targets]
        if not all(isinstance(t, (cst.Name, cst.Attribute)) for t in targets):
            return updated_node
        value = self._per_rank_device(original_node, original_node.value)
        return updated_node if value is None else updated_node.with_changes(value=value)

    def leave_Return(self, original_node: cst.Return, updated_node: cst.Return) -> cst.Return:
        """``return torch.device("cuda:0" if ... else "cpu")``: a ``select_device()`` helper."""
        if original_node.value is None:
            return updated_node
        body = original_node.value.body if isinstance(original_node.value, cst.IfExp) else original_node.value
        if not self.is_call(original_node.value, N.TORCH_DEVICE) and P.string_value(body) == "cuda":
            return updated_node  # ("cuda", the current GPU: the setup sets it to LOCAL_RANK's)
        value = self._per_rank_device(original_node, original_node.value)
        return updated_node if value is None else updated_node.with_changes(value=value)

    def _per_rank_device(self, original_node: cst.CSTNode, value: cst.BaseExpression) -> Optional[cst.BaseExpression]:
        """The per-rank spelling of the device ``value`` (None: none needed, or
        reported instead)."""
        if P.is_rank_device(self, value) or not P.is_device_spec(self, value):
            return None
        if self._in_multi_gpu(original_node):
            return None
        test = P.device_fallback_test(self, value)
        torch_name = self.torch()
        test_code = (
            self.module.code_for_node(test) if test is not None else f"{torch_name}.cuda.is_available()"
        )
        body = value.body if isinstance(value, cst.IfExp) else value
        if not self.is_call(value, N.TORCH_DEVICE) and P.string_value(body) == "cuda":
            # "cuda" means the current GPU, which the setup sets to LOCAL_RANK's
            if test is not None:
                return None
            self.changed(original_node, "the device falls back to the CPU when there is no GPU")
            return cst.parse_expression(f'"cuda" if {test_code} else "cpu"')
        local_rank = self.rank_name(original_node, "local_rank")
        if local_rank is None:
            self.manual(original_node, "device assignment where LOCAL_RANK cannot be read")
            return None
        spec = f'f"cuda:{{{local_rank}}}" if {test_code} else "cpu"'
        if self.is_call(value, N.TORCH_DEVICE) or self.is_call(body, N.TORCH_DEVICE):
            # torch.device(...), or torch.device("cuda") if ... else torch.device("cpu"):
            # still a torch.device (device.type in autocast/GradScaler)
            spec = f"{torch_name}.device({spec})"
        self.explicit_gpu_note(body)
        self._note_own_cuda_switch(original_node, test)
        self.changed(original_node, "the device is this process's GPU (LOCAL_RANK), CPU without one")
        return cst.parse_expression(spec)

    def _note_own_cuda_switch(self, node: cst.CSTNode, test: Optional[cst.BaseExpression]) -> None:
        """``"cuda" if use_cuda else "cpu"`` (a --no-cuda flag): the device follows the
        script's switch, but the backend (NCCL) and DDP's device_ids follow
        torch.cuda.is_available() -- off on a GPU machine, they disagree.  Said once."""
        if test is None or self._switch_noted:
            return
        if isinstance(test, cst.Name):  # use_cuda = torch.cuda.is_available(): an alias
            test = self.only_value(test) or test
        code = self.module.code_for_node(test)
        if re.fullmatch(r"[\w.]*cuda\.is_available\(\)", code):
            return
        self._switch_noted = True
        self.note(
            node,
            f"the device follows the script's own switch ({code}), while the process group's "
            "backend (NCCL with a GPU) and DDP's device_ids follow torch.cuda.is_available(): "
            "to run on the CPU of a GPU machine, hide the GPUs (CUDA_VISIBLE_DEVICES=) instead "
            "of switching CUDA off",
            code="DDP005",
        )

    def explicit_gpu_note(self, node: cst.CSTNode) -> None:
        """A GPU the user picked (``f"cuda:{args.gpu}"``, ``.cuda(args.gpu)``,
        ``set_device(gpu_ids[0])``) is replaced by LOCAL_RANK's: say so."""
        candidates = [node]
        if P.cuda_string_indices(node) is not None:  # f"cuda:{gpu}", "cuda:{}".format(gpu), ...
            candidates = P.cuda_string_indices(node)
        elif self.is_call(node, N.TORCH_DEVICE):
            candidates = [a.value for a in node.args[1:]]
            first = node.args[0].value if node.args else None
            candidates += P.cuda_string_indices(first) or [] if first is not None else []
        elif isinstance(node, (cst.SimpleString, cst.IfExp)):
            return
        for candidate in candidates:
            base = candidate.value if isinstance(candidate, cst.Subscript) else candidate
            name = P.dotted_name(base)
            if name and not name.startswith("torch") and name != "local_rank":
                self.note(
                    node,
                    f"the GPU chosen by {self.module.code_for_node(candidate)} is replaced by the GPU "
                    "of LOCAL_RANK; choose the GPUs with CUDA_VISIBLE_DEVICES",
                )
                return

    # torch.cuda.set_device(0) -------------------------------------------------
    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> Union[cst.SimpleStatementLine, cst.RemovalSentinel]:
        body = original_node.body
        if (
            len(body) == 1
            and isinstance(body[0], cst.Expr)
            and self.is_call(body[0].value, N.CUDA_SET_DEVICE)
            and not m.matches(body[0].value.args[0].value if body[0].value.args else None, m.Name("local_rank"))
        ):
            if body[0].value.args:
                self.explicit_gpu_note(body[0].value.args[0].value)
            self.changed(original_node, "dropped torch.cuda.set_device(): the setup sets LOCAL_RANK's GPU")
            return cst.RemoveFromParent()
        return updated_node


def _int_literal(node: cst.BaseExpression) -> bool:
    """``0``, ``-1``."""
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        node = node.expression
    return isinstance(node, cst.Integer)


def _option_flag(call: cst.Call) -> str:
    """``--gpu-ids`` of ``parser.add_argument("--gpu-ids", ...)``; "" for other calls."""
    if not m.matches(call.func, m.Attribute(attr=m.Name("add_argument"))) or not call.args:
        return ""
    return P.string_value(call.args[0].value) or ""


def _local_rank_option(call: cst.Call) -> bool:
    return _option_flag(call) in ("--local_rank", "--local-rank")


_GPU_OPTIONS = frozenset(
    {"gpus", "gpu_ids", "gpu_id", "gpu", "device_ids", "devices", "gpu_list", "n_gpu", "ngpu", "num_gpus"}
)


def _commas(args):
    out = []
    for index, arg in enumerate(args):
        if index < len(args) - 1:
            arg = arg.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        out.append(arg)
    return out


#: a GPU index by its name: ``gpu``, ``args.gpu``, ``opt.gpu_ids[0]``, ``gpus[0]``
_GPU_INDEX_NAME = re.compile(r"(?i)^gpus?(_?ids?)?$")


def _gpu_list_index(node: cst.BaseExpression) -> Optional[str]:
    """The index of ``gpus[1]``, ``opt.gpu_ids[0]`` (a literal one, into a list named
    as GPUs); None for anything else."""
    if not isinstance(node, cst.Subscript) or len(node.slice) != 1:
        return None
    index = node.slice[0].slice
    if not (isinstance(index, cst.Index) and isinstance(index.value, cst.Integer)):
        return None
    return index.value.value if _gpu_name(node.value) else None


def _gpu_name(node: cst.BaseExpression) -> bool:
    name = P.dotted_name(node)
    return bool(name) and bool(_GPU_INDEX_NAME.match(name.rsplit(".", 1)[-1]))


def _other_gpu_of_a_list(node: cst.BaseExpression) -> bool:
    """``gpus[1]``: a GPU of a list other than the first."""
    return _gpu_list_index(node) not in (None, "0")


def _gpu_index(node: cst.BaseExpression) -> bool:
    """``net.to(opt.gpu_ids[0])`` (pix2pix's init_net), ``.to(self.gpu_id)``: ``.to()``
    of a GPU number (the first of a list; another one is model parallelism)."""
    if isinstance(node, cst.Subscript):
        return _gpu_list_index(node) == "0"
    return _gpu_name(node)
