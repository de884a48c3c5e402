"""DDP101 distributed-sampler: shard the training DataLoader across the processes.

Without a ``DistributedSampler`` every DDP process trains on the whole dataset:
N times the work for the same model (B1).  The training loader gets one, with the
loader's old ``shuffle`` moved into it (the two together raise ``ValueError``;
``DataLoader`` defaults to ``shuffle=False`` while the sampler defaults to
``True``, so the old value is always written out)::

    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)

becomes::

    train_loader = DataLoader(
        train_set,
        batch_size=per_rank_batch_size(args.batch_size),
        sampler=DistributedSampler(train_set, shuffle=True),
    )

Batch size (DDP103, B3): DataParallel's ``batch_size`` is the global batch, split
across the GPUs; DDP processes load their own batches.  By default each process
takes ``batch_size // world_size`` (``per_rank_batch_size`` raises a clear error
when it does not divide), so the converted script trains the same model.  With
``--batch-size per-process`` the number is kept per process and the report says
that the global batch and the learning rate changed.

Loaders built from ``**kwargs`` dicts get the override merged into the dict.
Which loader trains is told from its names (``train_loader``, ``train_set``,
``def get_train_loader``), ``shuffle=True``, or a loop that calls ``backward()``;
evaluation loaders stay unsharded (every rank evaluates the whole set, so no
metric counts the sampler's padding twice); a loader that cannot be told apart,
a custom ``sampler=``/``batch_sampler=`` and an ``IterableDataset`` are reported.
"""

from __future__ import annotations

import ast

import re

from typing import Dict, List, Optional, Set, Tuple

import libcst as cst
import libcst.matchers as m
from libcst.metadata import ScopeProvider

from . import _analysis as A
from . import _names as N
from . import _loaders as L
from . import _patterns as P
from ._bridge import character_column
from ._base import FileRole, Transform

PER_RANK_BATCH_SIZE = '''
def {name}(global_batch_size):
    """This process's share of the global batch (added by dp2ddp).

    DataParallel split each batch across the GPUs; DDP processes load their own,
    so the global batch is kept by dividing it by the number of processes.
    """
    world_size = dist.get_world_size() if dist.is_initialized() else 1
    if global_batch_size % world_size:
        raise ValueError(
            f"batch size {{global_batch_size}} is not divisible by the {{world_size}} "
            f"processes: choose a multiple of {{world_size}}"
        )
    return global_batch_size // world_size
'''


#: contexts and decorators under which no gradient is recorded
#: functions that evaluate (``evaluate``, ``validate``, ``test_epoch``, ``run_eval``)
_EVAL_FUNCTION = re.compile(r"(?i)(^|_)(val|valid|validate|validation|eval|evaluate|evaluation|test)(_|$)")

#: a name or attribute that holds a batch size (``batch_size``, ``args.batchSize``, ``bs``)


class DistributedSamplerTransform(Transform):
    CODE = "DDP101"
    NAME = "distributed-sampler"
    DESCRIPTION = "Give the training DataLoader a DistributedSampler (shuffle moved into it)."
    TRIGGERS = ("DataLoader", "arange")  # (arange: a contrastive loss of the model's module)

    @classmethod
    def applies_to(cls, role: FileRole) -> bool:
        return role.in_program and not role.already_distributed

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        #: loops over a converted loader -> its global batch expression (``opt.batchSize``)
        self._batch_loops: Dict[cst.For, str] = {}
        self._batch_reported: Set[cst.CSTNode] = set()
        self._sum_noted = False
        self._contrast_noted = False
        self._contrast_looked: Set[bool] = set()
        self._random_noted = False
        #: training loaders whose ``sampler=`` variable became a DistributedSampler -> its shuffle
        self._named_plain: Dict[cst.Call, str] = {}
        self._streams_noted: Set[cst.Call] = set()  # (RandomSampler(replacement=True) replaced)
        #: training loaders that keep their batch size per process -> why
        self._kept_per_process: Dict[cst.Call, str] = {}

    def visit_Module(self, node: cst.Module) -> bool:
        if "DataLoader" not in self.module_code:
            # a module of the program without loaders (models.py, losses.py): its
            # in-batch-negatives loss sees only this process's share once the
            # program's loaders are sharded
            if self.role.program_loads_data:
                self._note_in_batch_comparison(needs_a_loss=True)
            return False
        # (before any statement is left: the uses may come earlier in the file than the loader)
        for call in P.find(node, cst.Call):
            if self.is_call(call, N.DATA_LOADER) and self._will_share_the_batch(call):
                why = self._batch_kept_per_process(call)
                if why:
                    self._kept_per_process[call] = why
                else:
                    self._report_batch_uses_elsewhere(call, _arg(call, 1, "batch_size"))
        return True

    def _batch_kept_per_process(self, loader: cst.Call) -> str:
        """Why this training loader keeps its ``batch_size`` per process ("" when it
        does not): the program builds tensors the size of its batches from that
        number -- in-batch labels in a loss of the program
        (``FileRole.program_batches_per_process``), a mask in the function the loop
        runs (``_loaders.batch_kept_per_process``).  Divided, the batches would no
        longer match them (a shape mismatch); kept, each process contrasts as many
        samples as the original did, and the global batch grows."""
        batch = P.dotted_name(_arg(loader, 1, "batch_size"))
        if L.scales_the_learning_rate(self.ast_source, batch):
            return ""  # (it means the global batch here)
        if batch.rsplit(".", 1)[-1] in self.role.program_batches_per_process:
            return f"a loss of the program builds its in-batch labels from {batch}"
        call = self.ast_call(loader)
        use = L.batch_kept_per_process(self.ast_source, batch, call) if call is not None else None
        if use is None:
            return ""
        func = self.ast_source.function_of(use)
        where = f"{func.name}()" if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) else "the code"
        return f"{where} builds tensors the size of a batch from {batch} (line {use.lineno})"

    def _will_share_the_batch(self, call: cst.Call) -> bool:
        """``_convert`` will give this loader a DistributedSampler and divide its
        ``batch_size`` expression by the world size (what the loader's
        ``leave_Call`` decides, asked before the pass)."""
        batch = _arg(call, 1, "batch_size")
        if self.settings.batch_size == "per-process" or batch is None or not P.dotted_name(batch):
            return False
        if not _given_outside(call, 1, "batch_size") or any(a.star == "*" for a in call.args):
            return False
        if _arg(call, 4, "batch_sampler") is not None and not _is_none(_arg(call, 4, "batch_sampler")):
            return False
        sampler = _arg(call, 3, "sampler")
        if sampler is not None and not _is_none(sampler) and self._plain_sampler(call) is None:
            value = self.only_value(sampler, pure=False) if isinstance(sampler, cst.Name) else None
            if not (isinstance(value, cst.Call) and self.is_call(value, N.RANDOM_SAMPLER | N.SEQUENTIAL_SAMPLER)):
                return False
        if self.classify(call)[0] != "train" or self.before_process_group(call):
            return False
        return not self._iterable_dataset(call)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if self.is_call(original_node, N.RANDOM_SAMPLER | N.SEQUENTIAL_SAMPLER):
            return self._named_sampler(original_node, updated_node)
        if not self.is_call(original_node, N.DATA_LOADER):
            return updated_node
        kind, why = self.classify(original_node)
        if kind == "eval":
            return updated_node
        too_early = self.before_process_group(original_node)
        if too_early:  # DistributedSampler asks the process group for the ranks when it is built
            self.manual(original_node, f"DataLoader built {too_early}")
            return updated_node
        if kind == "unknown":
            self.manual(
                original_node,
                "cannot tell whether this DataLoader feeds training; if it does, give it "
                "sampler=DistributedSampler(dataset, shuffle=...)",
            )
            return updated_node
        return self._convert(original_node, updated_node, why, when=kind == "train-when")

    # which loader is this? -----------------------------------------------------
    def loader_names(self, call: cst.Call) -> List[str]:
        """Names that tell what a loader is for: its variable, dataset, function."""
        names = []
        target = self._assigned_name(call)
        if target:
            names.append(target)
        dataset = _arg(call, 0, "dataset")
        if dataset is not None:
            names.append(P.dotted_name(dataset) or _subscript_key(dataset) or "")
            if isinstance(dataset, cst.Call):
                names.append(P.dotted_name(dataset.func))
                for arg in dataset.args:
                    if arg.keyword is not None and arg.keyword.value in ("train", "split", "mode", "subset"):
                        value = arg.value
                        if isinstance(value, cst.Name) and value.value in ("True", "False"):
                            names.append("train" if value.value == "True" else "test")
                        elif P.string_value(value):
                            names.append(P.string_value(value) or "")
        func = self.enclosing_function(call)
        if func is not None and not target:
            names.append(func.name.value)
        return [n for n in names if n]

    def classify(self, call: cst.Call) -> Tuple[str, str]:
        names = self.loader_names(call)
        target = self._assigned_name(call)
        if target and P.is_eval_name(target):
            return "eval", target
        if target and P.is_train_name(target):
            return "train", target
        train = [n for n in names if P.is_train_name(n)]
        evals = [n for n in names if P.is_eval_name(n)]
        shuffle = _arg(call, 2, "shuffle")
        if train and not evals:
            return "train", train[0]
        if evals and not train:
            return "eval", evals[0]
        if shuffle is not None and m.matches(shuffle, m.Name("True")) and not evals:
            return "train", "shuffle=True"
        if not evals and self._iterated_in_training_loop(call):
            return "train", "iterated by a loop that calls backward()"
        node = self.ast_call(call) if not train else None
        if node is not None and A.evaluated_only(self.ast_source, node):
            return "eval", "iterated without gradients only"
        # a loader factory of the entry script (no other module imports it)
        used_as = A.factory_kind(self.ast_source, node) if node is not None and self.role.is_entry else None
        if used_as is not None:
            return used_as, f"{used_as} loader of the file's {self.enclosing_function(call).name.value}()"
        node = node or self.ast_call(call)
        if node is not None and A.training_condition(self.ast_source, node) is not None:
            return "train-when", f"shuffle={self.module.code_for_node(shuffle)}"
        return "unknown", ""

    def _assigned_name(self, call: cst.Call) -> str:
        parent = self.parent(call)
        if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
            return P.dotted_name(parent.targets[0].target) or ""
        if isinstance(parent, cst.AnnAssign):
            return P.dotted_name(parent.target) or ""
        if isinstance(parent, cst.Element):
            tup = self.parent(parent)
            assign = self.parent(tup)
            if isinstance(tup, cst.Tuple) and isinstance(assign, cst.Assign) and len(assign.targets) == 1:
                target = assign.targets[0].target
                if isinstance(target, cst.Tuple) and len(target.elements) == len(tup.elements):
                    index = list(tup.elements).index(parent)
                    return P.dotted_name(target.elements[index].value) or ""
        if isinstance(parent, cst.DictElement):
            return P.string_value(parent.key) or ""
        if isinstance(parent, cst.Arg) and parent.keyword is not None:
            return parent.keyword.value
        return ""

    def _iterated_in_training_loop(self, call: cst.Call) -> bool:
        target = self._assigned_name(call)
        if not target:
            return False
        func = self.enclosing_function(call)
        scope_node = func if func is not None else self.module
        return any(
            target in {P.dotted_name(x) for x in _iterated(loop.iter)} and _calls_backward(loop.body)
            for loop in P.find(scope_node, cst.For)
        )

    # the rewrite ---------------------------------------------------------------
    def _plain_sampler(self, loader: cst.Call) -> Optional[str]:
        """``sampler=RandomSampler(dataset)`` / ``SequentialSampler(dataset)`` of the
        loader's own dataset, nothing else: the shuffle its DistributedSampler gets."""
        value = _arg(loader, 3, "sampler")
        dataset = _arg(loader, 0, "dataset")
        shuffle = _arg(loader, 2, "shuffle")
        if not isinstance(value, cst.Call) or dataset is None or shuffle is not None and not m.matches(
            shuffle, m.Name("False")
        ):
            return None  # (shuffle=False beside a sampler: DataLoader's default, taken out with it)
        source = value.args[0] if value.args else None
        if source is None or source.keyword is not None and source.keyword.value != "data_source":
            return None
        if self.module.code_for_node(source.value) != self.module.code_for_node(dataset):
            return None
        if self.is_call(value, N.SEQUENTIAL_SAMPLER) and len(value.args) == 1:
            return "False"
        if not self.is_call(value, N.RANDOM_SAMPLER):
            return None
        rest = {a.keyword.value if a.keyword else "" for a in value.args[1:]}
        if not rest:
            return "True"
        if rest <= {"replacement", "num_samples"} and m.matches(
            _arg(value, 1, "replacement"), m.Name("True")
        ) and self._restarted(loader):
            # an endless stream of draws with replacement (minGPT: num_samples=int(1e10)),
            # read by an iterator the loop starts again when it runs out
            if value in self._streams_noted:
                return "True"
            self._streams_noted.add(value)
            self.note(
                value,
                f"{P.dotted_name(value.func)}(replacement=True, num_samples=...) drew an endless stream "
                "with replacement; DistributedSampler(shuffle=True) gives each rank its own shuffled "
                "part, one pass at a time, and the loop's restart of its iterator begins the next pass "
                "(with the next epoch's order)",
            )
            return "True"
        return None

    def _restarted(self, loader: cst.Call) -> bool:
        call = self.ast_call(loader)
        return call is not None and L.restarted_on_stop_iteration(self.ast_source, call)

    def _named_sampler(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        """``train_sampler = RandomSampler(train_dataset)`` handed to one training
        DataLoader of the same dataset (``sampler=train_sampler``, Hugging Face's
        scripts): it becomes ``DistributedSampler(train_dataset, shuffle=True)``
        (``SequentialSampler``: ``shuffle=False``), and the loader keeps it."""
        assign = self.parent(original)
        if not (
            isinstance(assign, cst.Assign)
            and len(assign.targets) == 1
            and isinstance(assign.targets[0].target, cst.Name)
            and len(original.args) == 1
            and original.args[0].keyword is None
            and _simple(original.args[0].value)
        ):
            return updated
        name = assign.targets[0].target
        scope = self.get_metadata(ScopeProvider, name, None)
        if scope is None or len(list(scope.assignments[name.value])) != 1:
            return updated
        uses = [a.node for a in scope.accesses[name.value]]
        if len(uses) != 1:
            return updated
        arg = self.parent(uses[0])
        loader = self.parent(arg) if isinstance(arg, cst.Arg) else None
        if not (
            isinstance(loader, cst.Call)
            and self.is_call(loader, N.DATA_LOADER)
            and _arg(loader, 3, "sampler") is uses[0]
            and _arg(loader, 2, "shuffle") is None
            and _arg(loader, 4, "batch_sampler") is None
        ):
            return updated
        dataset = _arg(loader, 0, "dataset")
        if dataset is None or self.module.code_for_node(dataset) != self.module.code_for_node(original.args[0].value):
            return updated
        if self.classify(loader)[0] != "train" or self.before_process_group(loader) or self._blocked(loader):
            return updated
        shuffle = "True" if self.is_call(original, N.RANDOM_SAMPLER) else "False"
        self._named_plain[loader] = shuffle
        sampler_cls = self.object_alias("torch.utils.data.distributed", "DistributedSampler", N.DISTRIBUTED_SAMPLER)
        func = original.func
        self.drop_imports_if_unused(lambda qualified, bound: bound == P.dotted_name(func))
        self.changed(
            original,
            f"{P.dotted_name(func)} of the training data -> DistributedSampler(shuffle={shuffle}): each rank draws its own part",
            code="DDP101",
        )
        return cst.parse_expression(f"{sampler_cls}({self.module.code_for_node(original.args[0].value)}, shuffle={shuffle})")

    def _blocked(self, loader: cst.Call) -> bool:
        """The loader is one that ``_convert`` leaves for a human (its dataset is a
        stream, its arguments cannot be told apart)."""
        if self._iterable_dataset(loader) or not _simple(_arg(loader, 0, "dataset")):
            return True
        stars = [a for a in loader.args if a.star]
        return len(stars) > 1 or any(a.star == "*" for a in stars) or len(
            [a for a in loader.args if a.keyword is None and not a.star]
        ) > 3

    def _none_valued(self, value: cst.BaseExpression) -> bool:
        """``None``, or a name assigned ``None`` once and nothing else in its scope
        (CutMix, SupContrast: ``train_sampler = None`` ... ``sampler=train_sampler,
        shuffle=(train_sampler is None)``): DataLoader's default, no sampler."""
        if _is_none(value):
            return True
        if not isinstance(value, cst.Name):
            return False
        assigned = self.only_value(value, pure=False)
        return assigned is not None and _is_none(assigned)

    def _custom_sampler_message(self, keyword: str, value: cst.BaseExpression, loader: cst.Call) -> str:
        code = self.module.code_for_node(value)
        if isinstance(value, cst.Name):
            assigned = self.only_value(value, pure=False)
            value = assigned if assigned is not None else value
        if any(self.is_call(c, N.DISTRIBUTED_SAMPLER) for c in P.find(value, cst.Call)):
            return (
                f"training DataLoader with {keyword}={code}, which the script chooses itself (a "
                "DistributedSampler under some condition, e.g. args.local_rank != -1): make sure "
                "that condition holds under torchrun (LOCAL_RANK is in the environment)"
            )
        if isinstance(value, cst.Call) and self.is_call(value, N.RANDOM_SAMPLER | N.SEQUENTIAL_SAMPLER):
            shuffle = "True" if self.is_call(value, N.RANDOM_SAMPLER) else "False"
            return (
                f"training DataLoader with {keyword}={code} (a {P.dotted_name(value.func)}): use "
                f"DistributedSampler(dataset, shuffle={shuffle}) instead, so that each rank gets "
                "its own part of the data"
            )
        per_process = (
            " and divide its batch_size by the world size (it is per process now: the global batch "
            "grows with the number of processes)"
            if keyword == "sampler" and self.settings.batch_size != "per-process" and _arg(loader, 1, "batch_size") is not None
            else ""
        )
        return (
            f"training DataLoader with a custom {keyword}= ({code}): shard it across ranks by hand "
            f"(each rank must see a different part of the data){per_process}"
        )

    def _convert(self, original: cst.Call, updated: cst.Call, why: str, when: bool = False) -> cst.BaseExpression:
        """``when``: the loader trains where its ``shuffle`` holds (``A.training_condition``):
        the sampler and the per-process batch only then."""
        named = self._named_plain.get(original)  # (its sampler variable is a DistributedSampler now)
        plain = named or self._plain_sampler(original)
        for keyword in ("sampler", "batch_sampler"):
            value = _arg(original, 3 if keyword == "sampler" else 4, keyword)
            if value is None or self._none_valued(value) or keyword == "sampler" and plain is not None:
                continue  # (``sampler=None``: DataLoader's default, dropped below)
            if self.is_call(value, N.DISTRIBUTED_SAMPLER):
                return updated  # converted already
            self.manual(original, self._custom_sampler_message(keyword, value, original))
            return updated
        dataset = _arg(original, 0, "dataset")
        if dataset is not None and self._iterable_dataset(original):
            self.manual(
                original,
                "training DataLoader over an IterableDataset: a DistributedSampler cannot shard a "
                "stream (DataLoader refuses a sampler for it); split the stream by rank in its "
                "__iter__ (dist.get_rank(), dist.get_world_size(); get_worker_info() for workers)",
            )
            return updated
        stars = [a for a in updated.args if a.star == "**"]
        if len(stars) > 1 or any(a.star == "*" for a in updated.args):
            self.manual(original, "DataLoader built from several **kwargs: add a DistributedSampler by hand")
            return updated
        if dataset is None:
            self.manual(original, "DataLoader without a dataset argument: add a DistributedSampler by hand")
            return updated
        hoisted = None
        if not _simple(dataset):
            hoisted = self._hoist_dataset(original, dataset)
            if hoisted is None:
                self.manual(
                    original,
                    "the dataset is built inline here: assign it to a variable so that "
                    "the DistributedSampler can share it",
                )
                return updated
        if len([a for a in original.args if a.keyword is None and not a.star]) > 3:
            self.manual(original, "DataLoader with many positional arguments: add the sampler by hand")
            return updated
        dataset_code = hoisted or self.module.code_for_node(dataset)
        sampler_cls = self.object_alias(
            "torch.utils.data.distributed", "DistributedSampler", N.DISTRIBUTED_SAMPLER
        )
        star = stars[0] if stars else None
        shuffle_expr = _arg(original, 2, "shuffle")
        batch_expr = _arg(original, 1, "batch_size")
        kept = self._kept_per_process.get(original, "")
        per_process = self.settings.batch_size == "per-process" or bool(kept)
        new_args: List[cst.Arg] = []
        sampler_placed = False
        star_code = self.module.code_for_node(star.value) if star is not None else ""

        if named is not None:
            shuffle_code = named
            sampler_placed = True  # (sampler=train_sampler stays)
        elif plain is not None:
            shuffle_code = plain  # RandomSampler: shuffled; SequentialSampler: in order
            func = _arg(original, 3, "sampler").func  # the RandomSampler import goes if unused
            self.drop_imports_if_unused(lambda qualified, bound: bound == P.dotted_name(func))
        elif shuffle_expr is not None:
            shuffle_code = self.module.code_for_node(shuffle_expr)
        elif star is not None:
            shuffle_code = f'{star_code}.get("shuffle", False)'
        else:
            shuffle_code = "False"
        sampler_code = f"{sampler_cls}({dataset_code}, shuffle={shuffle_code})"
        condition = self.module.code_for_node(shuffle_expr) if when and shuffle_expr is not None else ""
        if condition:
            sampler_code = f"{sampler_cls}({dataset_code}, shuffle=True) if {condition} else None"
        # ``batch_size=1`` (detection scripts: images of different sizes) cannot be
        # shared: it stays one sample per process, and the global batch grows
        one_each = isinstance(batch_expr, cst.Integer) and batch_expr.evaluated_value == 1
        scale_batch = not per_process and not one_each  # by per_rank_batch_size(), added where it is used

        for index, (orig_arg, arg) in enumerate(zip(original.args, updated.args)):
            keyword = orig_arg.keyword.value if orig_arg.keyword is not None else None
            positional = keyword is None and not orig_arg.star
            if keyword in ("sampler", "batch_sampler") and self._none_valued(orig_arg.value):
                if index == len(original.args) - 1 and new_args:  # (the separator style stays)
                    new_args[-1] = new_args[-1].with_changes(comma=arg.comma)
                continue
            if hoisted is not None and (keyword == "dataset" or (positional and index == 0)):
                new_args.append(arg.with_changes(value=cst.Name(hoisted)))
                continue
            if keyword == "shuffle" or (positional and index == 2) or plain is not None and named is None and (
                keyword == "sampler" or positional and index == 3
            ):
                if sampler_placed:  # (shuffle=False beside the plain sampler it replaces)
                    if index == len(original.args) - 1 and new_args:
                        new_args[-1] = new_args[-1].with_changes(comma=arg.comma)
                    continue
                new_args.append(_kwarg("sampler", sampler_code, like=arg))
                sampler_placed = True
                continue
            if (keyword == "batch_size" or (positional and index == 1)) and scale_batch:
                batch = self.module.code_for_node(orig_arg.value)
                value = cst.parse_expression(
                    f"{self._batch_helper()}({batch}) if {condition} else {batch}" if condition
                    else f"{self._batch_helper()}({batch})"
                )
                new_args.append(arg.with_changes(value=value))
                self._watch_batch_uses(original, orig_arg.value)
                self._note_indivisible(orig_arg.value)
                continue
            if orig_arg.star == "**":
                # (a key of a **{...} literal is overridden in the merged dict too:
                # shuffle=True next to the sampler makes DataLoader raise)
                overrides = []
                if not _given_outside(original, 1, "batch_size") and scale_batch:
                    overrides.append(f'"batch_size": {self._batch_helper()}({star_code}.get("batch_size", 1))')
                if not _given_outside(original, 2, "shuffle"):
                    overrides.append('"shuffle": False')
                if not sampler_placed:
                    overrides.append(f'"sampler": {sampler_code}')
                    sampler_placed = True
                if not overrides:  # everything was given by keyword: the **kwargs stay as they are
                    new_args.append(arg)
                    continue
                merged = cst.parse_expression("{**%s, %s}" % (star_code, ", ".join(overrides)))
                new_args.append(arg.with_changes(value=merged))
                continue
            new_args.append(arg)
        if not sampler_placed:
            new_args = _append(new_args, _kwarg("sampler", sampler_code, like=new_args[-1]))
        self.changed(original, f"training DataLoader ({why}) gets a DistributedSampler")
        self._note_same_random_draws(original)
        if A.accumulates_metrics(self.ast_source) is not False:  # (None: the loop is elsewhere)
            self.note(
                original,
                "metrics computed over this loader during training (running loss, accuracy) "
                "now cover each rank's shard; all_reduce their sums for global numbers",
            )
        if kept:
            self.note(
                original,
                f"batch_size stays per process here: {kept}, which each process's batches must "
                "match (divided, they would not); each process trains on as many samples per step as "
                "the original did, so the global batch is batch_size x world size: scale the learning "
                "rate (linear rule, with warmup) or lower the batch",
                code="DDP103",
            )
        elif per_process:
            self.note(
                original,
                "batch_size is now per process: the global batch is batch_size x world size, "
                "so scale the learning rate (linear rule, with warmup) or lower the batch",
                code="DDP103",
            )
        elif one_each:
            self.note(
                batch_expr,
                "batch_size=1 stays 1 per process (one sample cannot be shared): the global batch "
                "is now 1 x world size, so the learning rate may need scaling (linear rule, with warmup)",
                code="DDP103",
            )
        elif batch_expr is None and star is None:
            self.note(
                original,
                "this DataLoader had no batch_size (1): each process now loads one sample",
                code="DDP103",
            )
        else:
            self.changed(
                original,
                "batch_size stays the global batch: each process loads batch_size // world_size",
                code="DDP103",
            )
            self._note_summed_loss()
            self._note_in_batch_comparison()
        return updated.with_changes(args=new_args)

    def _note_indivisible(self, batch: cst.BaseExpression) -> None:
        """A literal batch size that 2, 4 or 8 processes cannot share: said now,
        not only by ``per_rank_batch_size``'s error at run time."""
        if not isinstance(batch, cst.Integer):
            return
        size = int(batch.evaluated_value)
        fails = [n for n in (2, 4, 8) if size % n]
        if not fails or size <= 0:
            return
        works = [n for n in range(1, 9) if size % n == 0]
        self.note(
            batch,
            f"batch size {size} is the global batch: it divides among {', '.join(map(str, works))} "
            f"processes, not {', '.join(map(str, fails))} (per_rank_batch_size raises then); "
            "choose a multiple of the process count",
            code="DDP103",
        )

    def _note_same_random_draws(self, loader: cst.Call) -> None:
        """A loop over the loader draws random tensors (a GAN's noise) while the
        script seeds every process alike (``torch.manual_seed(0)``): every process
        then draws the same numbers, where DataParallel's one process drew
        different ones for each part of the batch.  Said once."""
        if self._random_noted or "manual_seed" not in self.module_code:
            return
        target = self._assigned_name(loader)
        if not target:
            return
        if not any(
            self.is_call(c, _SEEDS) and "rank" not in self.module.code_for_node(c).lower()
            for c in self.module_calls
        ):
            return
        for loop in P.find(self.enclosing_function(loader) or self.module, cst.For):
            if target not in {P.dotted_name(x) for x in _iterated(loop.iter)}:
                continue
            draw = next((c for c in P.find(loop.body, cst.Call) if self.is_call(c, _RANDOM_DRAWS)), None)
            if draw is None:
                continue
            self._random_noted = True
            self.note(
                draw,
                "every process draws the same random numbers here (the script seeds them all alike), "
                "where the one process of the original drew different ones for the whole batch: reseed each "
                "process after the model is built and wrapped -- torch.manual_seed(seed + "
                "dist.get_rank()) -- so that their draws differ",
                code="DDP103",
            )
            return

    def _note_in_batch_comparison(self, needs_a_loss: bool = False) -> None:
        """InfoNCE/SimCLR/CLIP: each sample's negatives are the rest of the batch,
        which is now this process's share only.  Said once, where the labels are.
        ``needs_a_loss``: (a module without loaders) only where the labels go into
        a loss -- attention's ``q @ k.transpose()`` next to ``torch.arange`` positions
        is not one."""
        if self._contrast_noted or needs_a_loss in self._contrast_looked:
            return
        self._contrast_looked.add(needs_a_loss)  # (the module's answer: once per kind of question)
        found = A.in_batch_labels_batch(self.ast_source, needs_a_loss)
        if found is None:
            return
        node, batch = found
        self._contrast_noted = True
        stmt = self.statement_at(node.lineno)
        line_node = stmt if stmt is not None else self.module
        if needs_a_loss and batch and batch.rsplit(".", 1)[-1] in self.role.program_batches_per_process:
            self.note(
                line_node,
                f"these in-batch labels are built from {batch}: the program's training loader keeps "
                f"{batch} samples per process, so they match each process's batch and each process "
                "contrasts as many samples as before (gather the embeddings of all processes -- "
                "torch.distributed.nn.functional.all_gather -- for world_size times more negatives)",
                code="DDP103",
            )
            return
        if needs_a_loss and batch:
            # (SimCLR: torch.arange(self.args.batch_size) against a half batch -- a shape mismatch)
            self.manual(
                line_node,
                f"these in-batch labels are built from {batch}, the global batch size, but the program's "
                f"training loader now gives each process per_rank_batch_size({batch}) samples: build them "
                "from the batch's own size (e.g. features.shape[0] // n_views), and gather the embeddings "
                "of all processes (torch.distributed.nn.functional.all_gather) to keep as many negatives",
                code="DDP103",
            )
            return
        self.note(
            line_node,
            "this loss compares the samples of a batch with each other (a similarity matrix "
            "against torch.arange labels: in-batch negatives); each process now builds it from "
            "its own share of the batch, so it has world_size times fewer negatives -- gather "
            "the embeddings of all processes first (torch.distributed.nn.functional.all_gather "
            "keeps their gradients) to train as before",
            code="DDP103",
        )

    def _note_summed_loss(self) -> None:
        """``reduction="sum"`` (pytorch/examples' VAE): DataParallel's loss summed the
        whole batch; under DDP each process sums its share and DDP *averages* the
        gradients, so they come out world_size times smaller.  Said once."""
        if self._sum_noted:
            return
        for call in self.module_calls:
            for arg in call.args:
                keyword = arg.keyword.value if arg.keyword is not None else ""
                summed = (keyword == "reduction" and P.string_value(arg.value) == "sum") or (
                    keyword == "size_average" and m.matches(arg.value, m.Name("False"))
                )
                if summed and self._for_gradients(call) and not self._normalised(call):
                    self._sum_noted = True
                    self.note(
                        call,
                        "a summed loss (reduction=\"sum\"): DDP averages the gradients of the "
                        "processes, so each step's gradient is now 1/world_size of the "
                        "original's; multiply this loss by dist.get_world_size() (or the "
                        "learning rate) to train as before",
                        code="DDP103",
                    )
                    return
        self._sum_noted = True  # (none in this module: the next loader need not look again)

    def _normalised(self, call: cst.Call) -> bool:
        """The summed loss is divided by a count where it is computed --
        ``CrossEntropyLoss(reduction="sum")(out, tgt) / ntokens``, or
        ``criterion(out, tgt) / ntokens`` at every use of ``criterion = ...(reduction="sum")``:
        a mean over this process's data, which DDP's averaging keeps as it was."""

        def divided(node: cst.CSTNode) -> bool:
            parent = self.parent(node)
            if isinstance(parent, cst.Call) and parent.func is node:  # the loss module, called
                node, parent = parent, self.parent(parent)
            return (
                isinstance(parent, cst.BinaryOperation) and isinstance(parent.operator, cst.Divide)
                and parent.left is node
                # (by the dataset's size: a sum still, only scaled)
                and "dataset" not in self.module.code_for_node(parent.right)
            )

        if divided(call):
            return True
        assign = self.parent(call)
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1):
            return False
        name = P.dotted_name(assign.targets[0].target)
        uses = [c for c in self.module_calls if name and P.dotted_name(c.func) == name]
        return bool(uses) and all(divided(use) for use in uses)

    def _for_gradients(self, call: cst.Call) -> bool:
        """A summed loss that may reach ``backward()``: not one computed under
        ``torch.no_grad()``/``inference_mode()``, in an evaluation function, or
        taken straight to a number (``.item()``) -- a metric, whose sum the note's
        advice would only distort."""
        parent = self.parent(call)
        if isinstance(parent, cst.Attribute) and parent.attr.value in ("item", "tolist", "detach"):
            return False
        for anc in self.ancestors(call):
            if isinstance(anc, cst.With) and any(
                isinstance(item.item, cst.Call) and P.dotted_name(item.item.func).rsplit(".", 1)[-1] in A.NO_GRAD
                for item in anc.items
            ):
                return False
            if isinstance(anc, cst.FunctionDef):
                if _EVAL_FUNCTION.search(anc.name.value) or any(
                    P.dotted_name(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator)
                    .rsplit(".", 1)[-1] in A.NO_GRAD
                    for d in anc.decorators
                ):
                    return False
        return True

    def _iterable_dataset(self, loader: cst.Call) -> bool:
        """The loader's dataset is an ``IterableDataset`` (``_analysis.iterable_dataset``,
        lint's test, on the ``ast`` call at the same place)."""
        call = self.ast_call(loader)
        return call is not None and A.iterable_dataset(self.ast_source, A.argument(call, 0, "dataset"))

    def _hoist_dataset(self, call: cst.Call, dataset: cst.BaseExpression) -> Optional[str]:
        """Assign an inline dataset to a variable before the statement; its name."""
        stmt = self.statement_of(call)
        if stmt is None:
            return None
        for anc in self.ancestors(call):
            if anc is stmt:
                break
            if isinstance(anc, (cst.Lambda, cst.IfExp, cst.BooleanOperation, cst.ListComp,
                                cst.GeneratorExp, cst.DictComp, cst.SetComp)):
                return None
        if isinstance(stmt, (cst.While, cst.If)) or not isinstance(self.parent(stmt), (cst.IndentedBlock, cst.Module)):
            return None
        target = self._assigned_name(call).rsplit(".", 1)[-1]
        base = target.replace("loader", "dataset") if "loader" in target else "train_dataset"
        if base == target or not base.isidentifier():
            base = "train_dataset"
        name = self.free_name(base, call)
        assign = cst.SimpleStatementLine(
            body=[cst.Assign(targets=[cst.AssignTarget(cst.Name(name))], value=dataset)]
        )
        self.insert_before(stmt, [assign])
        self.changed(call, f"the inline dataset is assigned to {name} so the sampler can share it")
        return name

    # the global batch size used again in the training loop ----------------------
    def _watch_batch_uses(self, loader: cst.Call, batch: cst.BaseExpression) -> None:
        """The loader now yields ``per_rank_batch_size(batch)`` samples per step:
        the loops over it that use ``batch`` again (``torch.full((opt.batchSize,),
        1.0)``, DCGAN's labels and noise) must too."""
        name = P.dotted_name(batch)
        target = self._assigned_name(loader)
        if not name or not target:
            return
        scope = self.enclosing_function(loader) or self.module
        for loop in P.find(scope, cst.For):
            if target in {P.dotted_name(x) for x in _iterated(loop.iter)} and not _binds(loop, name):
                self._batch_loops[loop] = name

    def _report_batch_uses_elsewhere(self, loader: cst.Call, batch: cst.BaseExpression) -> None:
        """The global batch used in another function of the file -- a loss or a
        helper that the training loop runs on its batches (``_loaders.batch_uses_elsewhere``):
        reported, since each process's batches now hold its share only
        (``torch.arange(args.batch_size)`` against a half batch: a shape mismatch)."""
        name = P.dotted_name(batch)
        call = self.ast_call(loader)
        if not name or call is None:
            return
        uses = L.batch_uses_elsewhere(self.ast_source, name, call)
        if not uses:
            return
        lines = self.ast_source.lines
        wanted = {(u.lineno, character_column(lines, u.lineno, u.col_offset)) for u in uses}
        for node in P.find(self.module, cst.Name, cst.Attribute):
            if self.position(node) not in wanted or P.dotted_name(node) != name:
                continue
            stmt = self.statement_of(node)
            if stmt is None or stmt in self._batch_reported:
                continue
            self._batch_reported.add(stmt)
            func = self.enclosing_function(node)
            where = f"{func.name.value}()" if func is not None else "this code"
            self.manual(
                node,
                f"{name} is the global batch, but {where} may run on the training loader's batches, "
                f"which now hold per_rank_batch_size({name}) samples per process: use the batch's own "
                "size (x.size(0)) here, or convert with --batch-size per-process",
                code="DDP103",
            )

    def _loop_batch(self, node: cst.CSTNode) -> str:
        """The global batch expression watched in the loop around ``node`` ("" if none)."""
        if not self._batch_loops:
            return ""
        for anc in self.ancestors(node):
            if isinstance(anc, (cst.For, cst.FunctionDef)):
                # the innermost loop decides (a validation loop inside the training loop
                # iterates another loader: its batches are whole)
                return self._batch_loops.get(anc, "")
        return ""

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.BaseExpression:
        return self._batch_use(original_node, updated_node)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.BaseExpression:
        return self._batch_use(original_node, updated_node)

    def _batch_use(self, original, updated):
        name = self._loop_batch(original)
        if not name or P.dotted_name(original) != name:
            return updated
        parent = self.parent(original)
        if isinstance(parent, cst.Attribute):
            return updated  # ``opt`` of ``opt.batchSize``; ``batch_size`` of ``args.batch_size``
        if isinstance(parent, cst.Arg) and parent.keyword is original:
            return updated  # ``batch_size=`` of a call
        if self._shape_argument(original):
            self.changed(
                original,
                f"{name} in a shape inside the training loop -> {self._batch_helper()}({name}): "
                "the loader now yields this process's share of the batch",
            )
            return cst.parse_expression(f"{self._batch_helper()}({self.module.code_for_node(original)})")
        stmt = self.statement_of(original)
        if stmt is not None and stmt not in self._batch_reported:
            self._batch_reported.add(stmt)
            self.manual(
                original,
                f"{name} is the global batch, but each process's batches now hold "
                f"per_rank_batch_size({name}) samples: use the batch's own size (x.size(0)) here, "
                "or convert with --batch-size per-process",
                code="DDP103",
            )
        return updated

    def _shape_argument(self, node: cst.CSTNode) -> bool:
        """``node`` is (an element of) a size argument of a tensor factory or of
        ``x.view(...)``: ``torch.full((bs,), 1.0)``, ``torch.randn(bs, nz, 1, 1)``."""
        current = self.parent(node)
        if isinstance(current, cst.Element):
            current = self.parent(self.parent(current))  # the tuple/list, then its Arg
        if not isinstance(current, cst.Arg) or current.keyword is not None and current.keyword.value != "size":
            return False
        call = self.parent(current)
        if not isinstance(call, cst.Call):
            return False
        if self.is_call(call, _TENSOR_FACTORIES):
            return True
        return isinstance(call.func, cst.Attribute) and call.func.attr.value in _SHAPE_METHODS

    def _batch_helper(self) -> str:
        dist = self.dist()
        return self.helper(
            "per_rank_batch_size",
            PER_RANK_BATCH_SIZE.replace("dist.", f"{dist}.").lstrip("\n"),
        )


# ------------------------------------------------------------------ helpers
def _given_outside(call: cst.Call, index: int, keyword: str) -> bool:
    """The argument is given by position or keyword (not only in a ``**{...}``)."""
    positional = [a for a in call.args if a.keyword is None and not a.star]
    return len(positional) > index or any(a.keyword is not None and a.keyword.value == keyword for a in call.args)


def _arg(call: cst.Call, position: int, keyword: str) -> Optional[cst.BaseExpression]:
    """An argument by keyword (also a key of a ``**{...}`` literal) or position."""
    positional = [a for a in call.args if a.keyword is None and not a.star]
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == keyword:
            return arg.value
        if arg.star == "**" and isinstance(arg.value, cst.Dict):
            for element in arg.value.elements:
                if isinstance(element, cst.DictElement) and P.string_value(element.key) == keyword:
                    return element.value
    if position < len(positional):
        return positional[position].value
    return None


def _subscript_key(node: cst.CSTNode) -> str:
    if isinstance(node, cst.Subscript) and node.slice:
        index = node.slice[0].slice
        if isinstance(index, cst.Index):
            return P.string_value(index.value) or ""
    return ""


def _simple(node: cst.CSTNode) -> bool:
    """Cheap and side-effect free to evaluate twice."""
    if isinstance(node, (cst.Name, cst.Attribute)):
        return bool(P.dotted_name(node))
    if isinstance(node, cst.Subscript):
        index = node.slice[0].slice if len(node.slice) == 1 else None
        return (
            _simple(node.value)
            and isinstance(index, cst.Index)
            and isinstance(index.value, (cst.SimpleString, cst.Integer, cst.Name))
        )
    return False


_ITER_WRAPPERS = frozenset({"enumerate", "tqdm", "iter", "zip", "islice", "track", "progress_bar"})


def _binds(node: cst.CSTNode, name: str) -> bool:
    """``name`` is assigned somewhere in ``node`` (``batch_size = x.size(0)``: the
    batch's own size from then on)."""
    for target in [*P.find(node, cst.AssignTarget), *P.find(node, cst.AugAssign), *P.find(node, cst.For)]:
        bound = target.target
        if any(P.dotted_name(n) == name for n in [bound, *P.find(bound, cst.Name), *P.find(bound, cst.Attribute)]):
            return True
    return False


#: calls whose positional arguments (or a tuple of them) are a shape
#: seeding calls, and the draws that a seed makes the same in every process
_SEEDS = frozenset({"torch.manual_seed", "torch.random.manual_seed", "torch.cuda.manual_seed_all", "torch.cuda.manual_seed"})
_RANDOM_DRAWS = frozenset(
    "torch." + f for f in ("randn", "rand", "randint", "randn_like", "rand_like", "randint_like", "normal", "bernoulli")
)
_TENSOR_FACTORIES = frozenset(
    "torch." + f for f in ("full", "zeros", "ones", "empty", "randn", "rand")
)
_SHAPE_METHODS = frozenset({"view", "reshape", "expand", "new_full", "new_zeros", "new_ones", "new_empty", "resize_"})


def _iterated(node: cst.BaseExpression):
    """The loaders a ``for`` iterates by name: ``loader``, ``enumerate(loader)``, ``tqdm(loader)``."""
    return (x for x in _inside_wrappers(node) if isinstance(x, (cst.Name, cst.Attribute)))


def _inside_wrappers(node: cst.BaseExpression):
    """What a ``for`` iterates once ``enumerate``/``tqdm``/``zip``... are taken off:
    ``loader``, ``DataLoader(...)`` of ``enumerate(DataLoader(...))``."""
    if isinstance(node, cst.Call):
        name = P.dotted_name(node.func).rsplit(".", 1)[-1]
        if name in _ITER_WRAPPERS:
            for arg in node.args[: (len(node.args) if name == "zip" else 1)]:
                if arg.keyword is None or arg.keyword.value == "iterable":  # tqdm(iterable=loader)
                    yield from _inside_wrappers(arg.value)
            return
    yield node


def _calls_backward(node: cst.CSTNode) -> bool:
    return P.calls_method(node, "backward")


def _is_none(node: Optional[cst.BaseExpression]) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


def _kwarg(name: str, code: str, like: cst.Arg) -> cst.Arg:
    return P.keyword_arg(name, cst.parse_expression(code)).with_changes(comma=like.comma)


def _append(args: List[cst.Arg], new: cst.Arg) -> List[cst.Arg]:
    """Append an argument, copying the separator style of the previous ones."""
    args = list(args)
    last = args[-1]
    if len(args) >= 2 and args[-2].comma is not cst.MaybeSentinel.DEFAULT:
        separator = args[-2].comma
    else:
        separator = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    trailing = last.comma
    args[-1] = last.with_changes(comma=separator)
    args.append(new.with_changes(comma=trailing))
    return args
