"""The instrumentation that runs inside each rank of a ``dp2ddp verify`` run.

    python -m dp2ddp.verify.harness SCRIPT ARGS...      (under torchrun, or forked)

It runs SCRIPT as ``__main__`` (as ``python SCRIPT`` would) after installing
light hooks that observe -- never change -- what the script computes:

* ``init_process_group``: backend, world size and rank; a finite timeout is
  passed when the script gives none, so that a rank stuck in a collective errors
  out instead of waiting 30 minutes;
* ``DistributedDataParallel.__init__``: which parameters are wrapped;
* a global optimizer step hook: step count, whether the optimizer's parameters
  are all in a DDP model, a checksum of the parameters after the first and the
  last step; at the step budget the script is stopped (``BudgetReached``);
* DataLoader iteration: the sample indices each pass draws (the full shard of a
  ``DistributedSampler``), and a per-epoch batch limit so that several (short)
  epochs fit in the budget;
* ``torch.save`` and ``open(..., "w")``: which files this rank writes;
* ``torch.cuda.set_device``: the GPU index this rank picks.

Everything is appended, as JSON lines, to ``<dir>/rank<R>.jsonl`` as it happens,
so that a rank that hangs or is killed still leaves its record.  ``SIGUSR1``
dumps every thread's Python stack to ``<dir>/stack<R>.txt`` (faulthandler).
"""

from __future__ import annotations

import builtins
import collections
import faulthandler
import io
import json
import os
import re
import runpy
import shutil
import signal
import sys
import time
import traceback
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Dict, List, Optional

ENV_DIR = "DP2DDP_VERIFY_DIR"
ENV_MAX_STEPS = "DP2DDP_VERIFY_MAX_STEPS"
ENV_EPOCH_BATCHES = "DP2DDP_VERIFY_EPOCH_BATCHES"
ENV_TIMEOUT = "DP2DDP_VERIFY_TIMEOUT"
ENV_MODE = "DP2DDP_VERIFY_MODE"  # "distributed" or "original"
ENV_DETERMINISTIC = "DP2DDP_VERIFY_DETERMINISTIC"

_HERE = os.path.dirname(os.path.abspath(__file__))


class BudgetReached(BaseException):
    """Raised from the optimizer step hook at the step budget (not an Exception,
    so that the script's own ``except Exception`` does not swallow it)."""


class Recorder:
    def __init__(self, directory: str, name: str) -> None:
        self.directory = directory
        self.name = name
        self.path = os.path.join(directory, f"{name}.jsonl")
        self._open = builtins.open  # the real one, before we patch it
        self.handle = self._open(self.path, "a", buffering=1)
        self.heartbeat_path = os.path.join(directory, f"{name}.alive")
        self._last_beat = 0.0
        #: the rank's own process: a DataLoader worker (forked from it, with these
        #: hooks) or a child the script forks is not the rank, and records nothing
        self.pid = os.getpid()
        self.beat(force=True)

    def in_rank_process(self) -> bool:
        return os.getpid() == self.pid

    def event(self, kind: str, **data: Any) -> None:
        if not self.in_rank_process():
            return
        data["event"] = kind
        data["t"] = time.time()
        try:
            self.handle.write(json.dumps(data, default=str) + "\n")
        except ValueError:  # closed at interpreter exit
            pass

    def beat(self, force: bool = False) -> None:
        if not self.in_rank_process():
            return
        now = time.time()
        if force or now - self._last_beat > 0.2:
            self._last_beat = now
            with self._open(self.heartbeat_path, "w") as handle:
                handle.write(f"{now}\n")


# ------------------------------------------------------------------ locations
_SCRATCH = re.compile(r".*[/\\]dp2ddp-verify-[^/\\]+[/\\]work(-original)?[/\\]")


def display(path: str) -> str:
    """A path relative to the working folder when it is below it, else absolute;
    a file in a run's scratch folder as the script named it (``checkpoint.pt``)."""
    scratch = _SCRATCH.match(path)
    if scratch:
        return path[scratch.end() :]
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def _user_location(script_dir: str, skip: int = 2) -> Optional[str]:
    """file:line of the innermost frame in the user's code (not torch, not us)."""
    frame = sys._getframe(skip)
    while frame is not None:
        filename = frame.f_code.co_filename
        if _is_user_file(filename, script_dir):
            return f"{display(filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def _is_user_file(filename: str, script_dir: str) -> bool:
    if filename.startswith("<") or filename.startswith(_HERE):
        return False
    path = os.path.abspath(filename)
    if "site-packages" in path or "dist-packages" in path:
        return False
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        if path.startswith(os.path.join(prefix, "lib")):
            return False
    return True


# ------------------------------------------------------------------ the hooks
class Harness:
    def __init__(self, script: str) -> None:
        self.script = os.path.abspath(script)
        self.script_dir = os.path.dirname(self.script)
        self.directory = os.environ[ENV_DIR]
        self.mode = os.environ.get(ENV_MODE, "distributed")
        rank = os.environ.get("RANK")
        self.rank = int(rank) if rank is not None else None
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.name = "original" if self.mode == "original" else f"rank{self.rank if self.rank is not None else 0}"
        self.max_steps = int(os.environ.get(ENV_MAX_STEPS, "20"))
        self.epoch_batches = int(os.environ.get(ENV_EPOCH_BATCHES, "0"))
        self.timeout = float(os.environ.get(ENV_TIMEOUT, "120"))
        self.rec = Recorder(self.directory, self.name)
        self.steps = 0
        self.ddp_params: set = set()
        self.last_optimizer = None
        self.passes: Dict[int, int] = {}
        self.loader_sites: Dict[int, Optional[str]] = {}
        self.open_passes: List["_RecordingIter"] = []
        self.written: set = set()
        self._stack_file = None
        self._replay: Optional[Dict[int, List[List[int]]]] = None
        #: every process group the script made or DDP uses, held until the rank leaves
        #: (``os._exit``: never destroyed).  Dropped by the script, the last reference to a
        #: Gloo group can be the DDP model's Reducer, freed when the script's ``main()``
        #: returns: pybind frees it holding the GIL, ``~ProcessGroupGloo`` joins its
        #: worker threads, and a worker still freeing the last all-reduce's work (a
        #: barrier's work holds it) waits for the GIL to drop a Python object -- the
        #: rank deadlocks at the ``main()`` line (seen 1 run in 11, three at once on two
        #: cores; py-spy's native stacks in the commit message).  Held here, the group
        #: outlives the script and the worker takes the GIL when the main thread yields it.
        self.keep: List[Any] = []

    def replay_plan(self, number: int) -> Optional[List[List[int]]]:
        """In the original's run (``--against``): the sample indices each rank drew in
        pass ``number`` of the distributed run's one shuffled training loader, so that
        the original's RandomSampler can be fed the same samples, batch for batch.
        None when there is not exactly one such loader to follow."""
        if self._replay is None:
            self._replay = {}
            loaders: Dict[str, set] = {}
            by_rank: Dict[int, Dict[int, List[int]]] = {}
            for name in sorted(os.listdir(self.directory)):
                match = re.fullmatch(r"rank(\d+)\.jsonl", name)
                if not match:
                    continue
                with builtins.open(os.path.join(self.directory, name)) as handle:
                    for line in handle:
                        try:
                            event = json.loads(line)
                        except ValueError:
                            continue
                        if event.get("event") != "pass" or event.get("sampler") != "DistributedSampler":
                            continue
                        if not event.get("shuffle"):
                            continue
                        loaders.setdefault(name, set()).add(event.get("loader"))
                        by_rank.setdefault(int(match.group(1)), {})[event["number"]] = event["indices"]
            if by_rank and all(len(ids) == 1 for ids in loaders.values()):
                ranks = sorted(by_rank)
                for number_ in set.intersection(*(set(by_rank[r]) for r in ranks)):
                    self._replay[number_] = [by_rank[r][number_] for r in ranks]
        return self._replay.get(number)

    # -- set-up ------------------------------------------------------------
    def install(self) -> None:
        self._stack_file = builtins.open(os.path.join(self.directory, f"stack-{self.name}.txt"), "w")
        if hasattr(signal, "SIGUSR1"):
            faulthandler.register(signal.SIGUSR1, file=self._stack_file, all_threads=True)
        self.rec.event(
            "start",
            pid=os.getpid(),
            rank=self.rank,
            local_rank=self.local_rank,
            visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
            world_size=int(os.environ.get("WORLD_SIZE", "1")),
            group_rank=os.environ.get("GROUP_RANK"),
            script=self.script,
            mode=self.mode,
        )
        import torch

        if os.environ.get(ENV_DETERMINISTIC) == "1":
            # cuBLAS is deterministic only with a fixed workspace, set before CUDA starts
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True, warn_only=True)
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = False
        self._patch_process_group(torch)
        self._patch_ddp(torch)
        self._patch_optimizer(torch)
        self._patch_loader(torch)
        self._patch_writes(torch)
        self._patch_set_device(torch)
        self._patch_exit()
        self._cpu_sync_batchnorm(torch)

    def _cpu_sync_batchnorm(self, torch) -> None:
        """SyncBatchNorm has no CPU kernel: on a CPU run, keep plain BatchNorm, say so."""
        if torch.cuda.is_available():
            return
        harness = self

        def keep_batchnorm(module, process_group=None):
            harness.rec.event(
                "note",
                text="SyncBatchNorm has no CPU kernel: on this CPU run convert_sync_batchnorm() "
                "was skipped and plain BatchNorm used (each rank normalises its own batch)",
            )
            return module

        torch.nn.SyncBatchNorm.convert_sync_batchnorm = staticmethod(keep_batchnorm)

    def _patch_process_group(self, torch) -> None:
        import torch.distributed as dist

        original = dist.init_process_group
        harness = self

        def init_process_group(*args, **kwargs):
            if "timeout" not in kwargs:
                kwargs["timeout"] = timedelta(seconds=harness.timeout + 30)
            result = original(*args, **kwargs)
            try:
                harness.keep.append(dist.distributed_c10d._get_default_group())
            except (AttributeError, RuntimeError, ValueError):  # an older or newer torch
                pass
            harness.rec.event(
                "init",
                backend=str(dist.get_backend()),
                world_size=dist.get_world_size(),
                rank=dist.get_rank(),
                where=_user_location(harness.script_dir),
            )
            return result

        init_process_group.__wrapped__ = original  # type: ignore[attr-defined]
        dist.init_process_group = init_process_group
        dist.distributed_c10d.init_process_group = init_process_group

    def _patch_ddp(self, torch) -> None:
        from torch.nn.parallel import DistributedDataParallel

        original = DistributedDataParallel.__init__
        harness = self

        def __init__(self, module, *args, **kwargs):
            original(self, module, *args, **kwargs)
            harness.keep.append(getattr(self, "process_group", None))  # (see Harness.keep)
            ids = {id(p) for p in module.parameters()}
            harness.ddp_params |= ids
            # the GPU the wrapped model lives on (DDP itself requires one device)
            devices = {p.device.index for p in module.parameters() if p.device.type == "cuda"}
            harness.rec.event(
                "ddp",
                params=len(ids),
                module=type(module).__name__,
                cuda_device=min(devices) if len(devices) == 1 else None,
                visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
                where=_user_location(harness.script_dir),
            )

        DistributedDataParallel.__init__ = __init__

    def _patch_optimizer(self, torch) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(self._after_step)

    def _after_step(self, optimizer, args, kwargs) -> None:
        self.steps += 1
        self.last_optimizer = optimizer
        self.rec.beat()
        if self.steps == 1:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            wrapped = sum(1 for p in params if id(p) in self.ddp_params)
            self.rec.event(
                "first_step",
                params=len(params),
                wrapped=wrapped,
                optimizer=type(optimizer).__name__,
                where=_user_location(self.script_dir, skip=3),
                checksum=self._checksum(optimizer),
            )
        if self.steps >= self.max_steps:
            self.finish_params("budget")
            raise BudgetReached()

    def _checksum(self, optimizer) -> Dict[str, Any]:
        import hashlib

        digest = hashlib.blake2b(digest_size=16)
        total = 0.0
        for group in optimizer.param_groups:
            for p in group["params"]:
                data = p.detach().cpu().contiguous()
                total += float(data.double().sum())
                try:
                    digest.update(data.view(-1).numpy().tobytes())
                except Exception:  # no numpy, or a dtype numpy lacks
                    digest.update(repr(data.double().sum().item()).encode())
        return {"hash": digest.hexdigest(), "sum": total}

    def finish_params(self, reason: str) -> None:
        optimizer = self.last_optimizer
        if optimizer is None:
            return
        import torch

        if os.environ.get(ENV_DETERMINISTIC) == "1" and torch.backends.cudnn.benchmark and torch.cuda.is_available():
            self.rec.event(
                "note",
                text="the script turns torch.backends.cudnn.benchmark on: cuDNN picks its algorithms by timing, "
                "so --against's weights may differ by that choice (turn it off to compare)",
            )
        self.rec.event("last_step", steps=self.steps, reason=reason, checksum=self._checksum(optimizer))
        if self.rank in (None, 0):
            import torch

            params = [p.detach().cpu().clone() for g in optimizer.param_groups for p in g["params"]]
            _REAL_SAVE(params, os.path.join(self.directory, f"params-{self.name}.pt"))

    def _patch_loader(self, torch) -> None:
        """The sampler's indices are drawn in the rank's process whatever the number
        of workers (``_next_index``: ahead of the training loop when workers prefetch);
        the batches come back, in order, from the DataLoader iterator's ``__next__``.
        A pass is the sampler's draw (``_RecordingIter``) and the loop's consumption
        of it: it is recorded when the consumption ends (the iterator is exhausted,
        reset for the next epoch, replaced by a new one, or the script stops)."""
        from torch.utils.data import dataloader as dl

        harness = self
        base = dl._BaseDataLoaderIter
        original_init = base.__init__
        original_reset = base._reset
        original_next = base.__next__
        original_loader_init = dl.DataLoader.__init__

        def loader_init(self, *args, **kwargs):
            original_loader_init(self, *args, **kwargs)
            harness.loader_sites[id(self)] = _user_location(harness.script_dir)

        def init(self, loader):
            original_init(self, loader)
            self._sampler_iter = _RecordingIter(harness, loader, self._sampler_iter)

        def reset(self, loader, first_iter=False):
            previous = getattr(self, "_sampler_iter", None)
            if isinstance(previous, _RecordingIter):
                previous.close()  # (persistent workers: the next epoch reuses this iterator)
            original_reset(self, loader, first_iter)
            self._sampler_iter = _RecordingIter(harness, loader, self._sampler_iter)

        def next_(self):
            recording = self._sampler_iter if isinstance(self._sampler_iter, _RecordingIter) else None
            try:
                batch = original_next(self)
            except StopIteration:
                if recording is not None:
                    recording.close()
                raise
            if recording is not None and harness.rec.in_rank_process():
                recording.consumed(batch)
            return batch

        dl.DataLoader.__init__ = loader_init
        base.__init__ = init
        base._reset = reset
        base.__next__ = next_

    def _patch_writes(self, torch) -> None:
        harness = self
        real_open = builtins.open
        global _REAL_SAVE
        _REAL_SAVE = torch.save

        scratch = os.getcwd()
        if not scratch.startswith(os.path.abspath(self.directory) + os.sep):
            scratch = None  # --workdir: the user chose where the script writes

        def save(obj, f, *args, **kwargs):
            path = _path_of(f)
            if path is not None:
                harness.wrote(path, "torch.save")
                if scratch and isinstance(f, (str, bytes, os.PathLike)):
                    private_copy(path, scratch, keep=False)
            return _REAL_SAVE(obj, f, *args, **kwargs)

        def open_(file, mode="r", *args, **kwargs):
            if _COPYING:  # the harness's own copy (shutil.copy2 in private_copy)
                return real_open(file, mode, *args, **kwargs)
            if isinstance(mode, str) and any(c in mode for c in "wax+"):
                path = _path_of(file)
                if path is not None:
                    harness.wrote(path, "open")
                    if scratch and not isinstance(file, int):
                        private_copy(path, scratch, keep="a" in mode or "+" in mode)
            return real_open(file, mode, *args, **kwargs)

        real_chdir = os.chdir

        def chdir(path):
            if scratch and not isinstance(path, int):
                target = os.path.normpath(os.path.join(os.getcwd(), os.fsdecode(os.fspath(path))))
                private_copy(target, scratch, keep=False, folder=True)
            return real_chdir(path)

        os.chdir = chdir
        torch.save = save
        import torch.serialization

        torch.serialization.save = save
        builtins.open = open_
        io.open = open_

    def wrote(self, path: str, how: str) -> None:
        if path in self.written or not _tracked(path, self.directory):
            return
        self.written.add(path)
        self.rec.event("write", path=path, how=how, step=self.steps, where=_user_location(self.script_dir, skip=3))

    def _patch_set_device(self, torch) -> None:
        original = torch.cuda.set_device
        harness = self

        def set_device(device):
            harness.rec.event(
                "set_device",
                index=_device_index(device),
                visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
                where=_user_location(harness.script_dir),
            )
            return original(device)

        torch.cuda.set_device = set_device

    def _patch_exit(self) -> None:
        """``os._exit`` in the script leaves at once (no ``end`` event, no traceback):
        say when, where and after how many steps, so that a rank that skips the rest
        of training this way is named.  (A DataLoader worker's or a forked child's
        ``os._exit`` is not the rank's: ``event`` records nothing there.)"""
        harness = self

        def _exit(status):
            try:
                if harness.rec.in_rank_process():  # the passes it was in, as a return would record them
                    for recording in list(harness.open_passes):
                        recording.close()
                harness.rec.event(
                    "exit", status=status, steps=harness.steps, where=_user_location(harness.script_dir)
                )
                sys.stdout.flush()
                sys.stderr.flush()
            except BaseException:  # leaving must not fail
                pass
            _REAL_EXIT(status)

        os._exit = _exit

    # -- running -----------------------------------------------------------
    def run(self, args: List[str]) -> int:
        from dp2ddp.launch import module_form

        sys.argv = [self.script, *args]
        # an entry point of a package that imports relatively runs as ``python -m
        # pkg.train`` from the folder above the package (as convert's launch line says)
        form = module_form(self.script)
        sys.path.insert(0, form[0] if form else self.script_dir)
        code = 0
        try:
            if form:
                runpy.run_module(form[1], run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(self.script, run_name="__main__")
            self.finish_params("completed")
            reason = "completed"
        except BudgetReached:
            reason = "budget"
        except SystemExit as exc:
            status = exc.code
            if status in (None, 0):
                self.finish_params("completed")
                reason = "completed"
            else:
                reason = "exit"
                code = status if isinstance(status, int) else 1
                self.rec.event("crash", traceback=f"SystemExit({status!r})", where=None)
        except BaseException as exc:  # the script crashed on this rank
            reason = "crash"
            code = 1
            tb = traceback.format_exc()
            self.rec.event("crash", traceback=tb, where=_exception_location(exc, self.script_dir))
        for recording in list(self.open_passes):
            recording.close()
        self.rec.event("end", reason=reason, steps=self.steps)
        return code


class _RecordingIter:
    """Wraps a DataLoader iterator's index iterator: records the pass, stops it
    after the per-epoch batch limit.  Nothing is drawn before the loader asks
    (a RandomSampler's seed comes from the global RNG: draw order is kept).

    The draw (``__next__``, in the rank's process, ahead of the loop when workers
    prefetch) and the consumption (``consumed``, each batch the loop receives) are
    counted apart: a pass trains when optimizer steps are taken while its batches
    are consumed, whoever fetched them."""

    def __init__(self, harness: Harness, loader, inner) -> None:
        self.harness = harness
        self.loader = loader
        self.inner = inner
        self.started = False
        self.batches = 0  # drawn by the sampler
        self.consumed_batches = 0  # received by the training loop
        self.indices: List[int] = []
        #: index batches drawn, not yet received (in order: the k-th batch out is the k-th drawn)
        self.pending: collections.deque = collections.deque()
        #: [index (None: an iterable dataset), fingerprint of the sample's content]
        self.samples: List[List[Any]] = []
        self.first_consumed_step: Optional[int] = None
        self.closed = False

    def __iter__(self):
        return self

    def _start(self) -> None:
        from torch.utils.data import DistributedSampler

        self.started = True
        harness = self.harness
        key = id(self.loader)
        harness.passes[key] = harness.passes.get(key, -1) + 1
        self.number = harness.passes[key]
        self.start_step = harness.steps
        from torch.utils.data import IterableDataset
        from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

        sampler = getattr(self.loader, "sampler", None)
        batches = getattr(self.loader, "batch_sampler", None)
        inner = getattr(batches, "sampler", None)
        via_batch_sampler = inner is not None and inner is not sampler  # DataLoader(batch_sampler=...)
        # a batch sampler of its own (a bucketing one, a BatchSampler subclass with its own
        # __iter__ that never set .sampler) draws the indices itself
        own_batches = (
            batches is not None
            and inner is None
            and (not isinstance(batches, BatchSampler) or type(batches).__iter__ is not BatchSampler.__iter__)
        )
        if via_batch_sampler:
            sampler = inner
        elif own_batches:
            sampler = batches
        info: Dict[str, Any] = {"sampler": type(sampler).__name__ if sampler is not None else None}
        info["iterable"] = isinstance(self.loader.dataset, IterableDataset)
        info["num_workers"] = getattr(self.loader, "num_workers", 0)
        info["dataset"] = type(self.loader.dataset).__name__
        info["dataset_defined"] = _defined_at(type(self.loader.dataset), harness.script_dir)
        #: the k-th batch out is the k-th drawn (an unordered loader: not so)
        self.fingerprinting = self.number < _FINGERPRINT_PASSES and getattr(self.loader, "in_order", True)
        if via_batch_sampler:
            info["batch_sampler"] = type(batches).__name__
        if own_batches:
            info["own_batches"] = True
        info["batch_size"] = getattr(self.loader, "batch_size", None) or getattr(batches, "batch_size", None)
        info["drop_last"] = bool(getattr(self.loader, "drop_last", False) or getattr(batches, "drop_last", False))
        try:
            info["dataset_len"] = len(self.loader.dataset)
        except TypeError:
            info["dataset_len"] = None
        subset, base = _subset_indices(self.loader.dataset)
        if subset is not None:  # a Subset (a shard made by hand?): its samples in the whole dataset
            try:
                info["subset_of"] = len(base)
            except TypeError:
                info["subset_of"] = None
            info["subset"] = subset if len(subset) <= _SUBSET_LIMIT else None
        if isinstance(sampler, DistributedSampler):
            info.update(
                shuffle=bool(sampler.shuffle),
                num_replicas=sampler.num_replicas,
                sampler_rank=sampler.rank,
                epoch=sampler.epoch,
                drop_last=bool(sampler.drop_last),
                shard=list(iter(sampler)),  # deterministic for a given epoch: no side effect
            )
        else:
            # torch's samplers say; a sampler of the project's own may shuffle or not (None)
            known = isinstance(sampler, (RandomSampler, SequentialSampler)) or sampler is None
            info["shuffle"] = isinstance(sampler, RandomSampler) if known else None
            try:
                # (a batch sampler's length counts batches, not samples)
                info["sampler_len"] = None if own_batches else len(sampler)
            except TypeError:
                info["sampler_len"] = None
        self.replay: Optional[List[List[int]]] = None
        if harness.mode == "original" and info["shuffle"]:
            self.replay = self._replay_batches(harness.replay_plan(self.number))
            info["replayed"] = self.replay is not None
        self.info = info
        harness.open_passes.append(self)

    def _replay_batches(self, plan: Optional[List[List[int]]]) -> Optional[List[List[int]]]:
        """The original's batches, each the union of the ranks' batches of the same
        step (DataParallel's batch = the DDP processes' batches together)."""
        from torch.utils.data import BatchSampler

        batch_size = getattr(self.loader, "batch_size", None)
        if not plan or not batch_size or not isinstance(getattr(self.loader, "batch_sampler", None), BatchSampler):
            return None
        world = len(plan)
        if batch_size % world:
            return None
        share = batch_size // world
        steps = max((len(p) + share - 1) // share for p in plan)
        return [[i for p in plan for i in p[step * share : (step + 1) * share]] for step in range(steps)]

    def __next__(self):
        if not self.started:
            self._start()
        harness = self.harness
        harness.rec.beat()
        if harness.epoch_batches and self.batches >= harness.epoch_batches:
            raise StopIteration
        if self.replay is not None:  # the distributed run's samples, not the sampler's draw
            if self.batches >= len(self.replay):
                raise StopIteration
            batch = self.replay[self.batches]
        else:
            batch = next(self.inner)
        self.batches += 1
        if isinstance(batch, (list, tuple)):
            self.indices.extend(int(i) for i in batch if isinstance(i, int) or hasattr(i, "__index__"))
        elif hasattr(batch, "__index__"):
            self.indices.append(int(batch))
        if self.fingerprinting:
            self.pending.append(batch)
        return batch

    def consumed(self, batch) -> None:
        """The training loop received ``batch`` (the next one drawn)."""
        harness = self.harness
        if not self.started:
            return
        if self.first_consumed_step is None:
            self.first_consumed_step = harness.steps
            for other in list(harness.open_passes):  # a new pass of this loader: the old one is over
                if other is not self and other.loader is self.loader and other.consumed_batches:
                    other.close()
        self.consumed_batches += 1
        drawn = self.pending.popleft() if self.pending else None
        if not self.fingerprinting or len(self.samples) >= _FINGERPRINT_SAMPLES:
            return
        if self.info.get("iterable"):
            prints = _sample_fingerprints(batch, None)
            indices: List[Any] = [None] * len(prints or ())
        elif isinstance(drawn, (list, tuple)):
            prints = _sample_fingerprints(batch, len(drawn))
            indices = [int(i) if hasattr(i, "__index__") else None for i in drawn]
        else:  # batch_size=None: one sample a batch
            prints = _sample_fingerprints(batch, 0)
            indices = [int(drawn) if hasattr(drawn, "__index__") else None]
        if prints is None:
            self.info["unprintable"] = True
            self.fingerprinting = False
            return
        self.samples.extend([i, p] for i, p in zip(indices, prints))

    def close(self) -> None:
        """The loop is done with this pass: record it."""
        if self.closed or not self.started:
            return
        self.closed = True
        harness = self.harness
        if self in harness.open_passes:
            harness.open_passes.remove(self)
        start = self.first_consumed_step if self.first_consumed_step is not None else harness.steps
        harness.rec.event(
            "pass",
            loader=id(self.loader),
            where=harness.loader_sites.get(id(self.loader)),
            number=self.number,
            start_step=start,
            end_step=harness.steps,
            batches=self.consumed_batches,
            drawn_batches=self.batches,
            indices=self.indices,
            samples=self.samples[:_FINGERPRINT_SAMPLES],
            **self.info,
        )


#: the content of the samples of a loader's first passes is fingerprinted (up to
#: this many a pass): the sharding of an iterable dataset, and whether two
#: processes hold the same sample for an index (``--against``), are judged by it
_FINGERPRINT_PASSES = 2
_FINGERPRINT_SAMPLES = 512


def _sample_fingerprints(batch, count: Optional[int]) -> Optional[List[str]]:
    """One short hash per sample of a collated batch: ``count`` samples (the
    leading dimension of every tensor in it; None: whatever that dimension is),
    0 for a batch that is one sample.  None when the batch holds something else
    than tensors, numbers and strings, or its parts disagree on the batch size."""
    import hashlib

    import torch

    leaves: List[Any] = []

    def walk(node) -> bool:
        if isinstance(node, torch.Tensor):
            leaves.append(node)
            return True
        if isinstance(node, (int, float, str, bytes, bool)):
            leaves.append(node)
            return True
        if isinstance(node, dict):
            return all(walk(node[k]) for k in sorted(node, key=str))
        if isinstance(node, (list, tuple)):
            return all(walk(item) for item in node)
        return False

    if not walk(batch) or not leaves:
        return None
    tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
    if count is None:
        if not tensors or tensors[0].dim() == 0:
            return None
        count = tensors[0].shape[0]
    if count == 0:  # the batch is one sample
        rows: List[List[Any]] = [leaves]
    else:
        if any(t.dim() == 0 or t.shape[0] != count for t in tensors) or len(tensors) != len(leaves):
            return None
        rows = [[t[i] for t in tensors] for i in range(count)]
    prints = []
    for row in rows:
        digest = hashlib.blake2b(digest_size=8)
        for part in row:
            if isinstance(part, torch.Tensor):
                data = part.detach().cpu().contiguous()
                digest.update(f"{data.dtype}{tuple(data.shape)}".encode())
                digest.update(data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b"")
            else:
                digest.update(repr(part).encode())
        prints.append(digest.hexdigest())
    return prints


def _device_index(device) -> Optional[int]:
    """The index ``torch.cuda.set_device`` was given: 1, "cuda:1", torch.device("cuda", 1);
    None for a device without one ("cuda": the current device, unchanged)."""
    if isinstance(device, int):
        return device
    import torch

    try:
        return torch.device(device).index
    except (TypeError, RuntimeError, ValueError):
        return None


def _defined_at(cls, script_dir: str) -> Optional[str]:
    """file:line of a class of the user's code (a dataset), None for torch's own."""
    import inspect

    try:
        filename = inspect.getsourcefile(cls)
        line = inspect.getsourcelines(cls)[1]
    except (TypeError, OSError):
        return None
    if not filename or not _is_user_file(filename, script_dir):
        return None
    return f"{display(filename)}:{line}"


_REAL_SAVE = None
#: the harness's own way out (the script's ``os._exit`` is recorded: ``_patch_exit``)
_REAL_EXIT = os._exit
#: a Subset's indices are recorded up to this many (they make the shard check exact)
_SUBSET_LIMIT = 200_000


def _subset_indices(dataset):
    """(indices into the innermost dataset, that dataset) for a -- possibly
    nested -- ``torch.utils.data.Subset``; (None, dataset) otherwise."""
    from torch.utils.data import Subset

    indices = None
    while isinstance(dataset, Subset):
        inner = dataset.indices
        indices = [int(i) for i in inner] if indices is None else [int(inner[i]) for i in indices]
        dataset = dataset.dataset
    return indices, dataset


def private_copy(path: str, scratch: str, keep: bool, folder: bool = False) -> None:
    """Copy on write: ``path`` lies in the scratch folder, which links the user's
    folders and large files; before the script writes there, every linked folder
    on the way becomes a folder of the scratch (of links to its entries) and a
    linked file is replaced by a copy (``keep``: appended to, or updated) or
    removed -- so the write lands in the scratch, never on the user's file, and
    what the script reads back is what it wrote.  The ranks take turns (a lock
    of the run): whoever comes second finds the scratch folder made.  ``folder``:
    ``path`` is a folder the script enters (``os.chdir``): it becomes a scratch
    folder too, so that what is written there stays in the scratch."""
    global _COPYING
    if not path.startswith(scratch + os.sep) or _COPYING:
        return
    with _scratch_lock(scratch):  # one rank at a time: no rank sees a folder half made
        _COPYING = True  # (the copy's own open() is not the script's: not hooked, not recorded)
        try:
            _private_copy(path, scratch, keep, folder)
        finally:
            _COPYING = False


#: the harness is copying a linked file into the scratch (see ``private_copy``)
_COPYING = False


@contextmanager
def _scratch_lock(scratch: str):
    """An exclusive lock of the run (a file next to the scratch folder, which the
    script does not see); no lock where ``fcntl`` is missing."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    handle = os.open(os.path.join(os.path.dirname(scratch), ".copy-on-write.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # (releases the lock)


def _private_copy(path: str, scratch: str, keep: bool, folder: bool) -> None:
    real_scratch = os.path.realpath(scratch)

    def linked_out(node: str) -> bool:
        if not os.path.islink(node):
            return False
        real = os.path.realpath(node)
        return not (real == real_scratch or real.startswith(real_scratch + os.sep))

    parts = os.path.relpath(path, scratch).split(os.sep)
    current = scratch
    try:
        for part in parts if folder else parts[:-1]:
            current = os.path.join(current, part)
            if linked_out(current) and os.path.isdir(current):
                _own_folder(current)
        if not folder and linked_out(path):
            target = os.path.realpath(path)
            temporary = f"{path}.dp2ddp-{os.getpid()}"
            if keep and os.path.isfile(target):
                shutil.copy2(target, temporary)
                os.replace(temporary, path)  # (replaces the link itself, not its target)
            else:
                os.unlink(path)
    except FileNotFoundError:
        pass  # a dangling link (its target gone): nothing of the user's to keep


def _own_folder(link: str) -> None:
    """Replace the link to a folder by a scratch folder of links to its entries
    (under the run's lock: made whole before any rank looks again)."""
    target = os.path.realpath(link)
    temporary = f"{link}.dp2ddp-{os.getpid()}"
    os.mkdir(temporary)
    for entry in os.scandir(target):
        os.symlink(entry.path, os.path.join(temporary, entry.name))
    os.unlink(link)
    os.rename(temporary, link)


def _path_of(f) -> Optional[str]:
    if isinstance(f, int):
        return None
    if isinstance(f, (str, bytes, os.PathLike)):
        path = os.fsdecode(os.fspath(f))
    else:
        path = getattr(f, "name", None)
        if not isinstance(path, str):
            return None
    return os.path.abspath(path)


def _tracked(path: str, record_dir: str) -> bool:
    """Files the user's script writes (not our records, not caches and devices)."""
    record_dir = os.path.abspath(record_dir)
    if path.startswith(record_dir + os.sep) and not path.startswith(os.path.join(record_dir, "work")):
        return False  # our records; the scratch working folders ("work*") are the script's
    if path.startswith(("/dev/", "/proc/", "/sys/")):
        return False
    for prefix in {sys.prefix, sys.base_prefix, os.path.expanduser("~/.cache")}:
        if path.startswith(os.path.abspath(prefix) + os.sep):
            return False
    return True


def _exception_location(exc: BaseException, script_dir: str) -> Optional[str]:
    where = None
    for frame, line in traceback.walk_tb(exc.__traceback__):
        if _is_user_file(frame.f_code.co_filename, script_dir):
            where = f"{display(frame.f_code.co_filename)}:{line}"
    return where


def main(argv: Optional[List[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m dp2ddp.verify.harness SCRIPT [ARGS...]", file=sys.stderr)
        raise SystemExit(2)
    harness = Harness(argv[0])
    harness.install()
    code = harness.run(argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # leave without the interpreter's teardown: a script stopped mid-epoch may
    # hold loader workers or a process group whose teardown could block
    _REAL_EXIT(code)


if __name__ == "__main__":
    main()
