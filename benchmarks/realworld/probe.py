"""rw_probe: copied next to the entry script of both trees and imported first.

Records, per process, into $RW_PROBE_DIR/rank<RANK>.json at exit:
  * passes: every iteration over a DataLoader (loader number, dataset length,
    the sample indices the sampler gave, backward() calls made meanwhile),
  * optimizers: per optimizer (creation order) the float64 sum and a hash of
    its parameters after the last step, and its step count,
  * saves: every torch.save path; writes: every file opened for writing.
Nothing here changes what the program computes.
"""
import atexit
import builtins
import hashlib
import json
import os

import torch
import torch.utils.data.dataloader as _dl

_DIR = os.environ.get("RW_PROBE_DIR")
_RANK = int(os.environ.get("RANK", "0"))
_loaders = {}  # id(loader) -> number
_passes = []
_cur = [None]
_optims = []
_steps = {}
_saves = []
_state = {"backward": 0}

_dl_init = torch.utils.data.DataLoader.__init__


def _loader_init(self, *a, **k):
    _dl_init(self, *a, **k)
    _loaders[id(self)] = len(_loaders)


torch.utils.data.DataLoader.__init__ = _loader_init

_it_init = _dl._BaseDataLoaderIter.__init__


def _iter_init(self, loader, *a, **k):
    _it_init(self, loader, *a, **k)
    try:
        n = len(loader.dataset)
    except Exception:
        n = -1
    rec = {"loader": _loaders.get(id(loader), -1), "n": n,
           "sampler": type(loader.sampler).__name__, "idx": [], "backward": 0}
    _passes.append(rec)
    self._rw_rec = rec


_dl._BaseDataLoaderIter.__init__ = _iter_init
_next_index = _dl._BaseDataLoaderIter._next_index


def _next_index_rec(self):
    i = _next_index(self)
    rec = getattr(self, "_rw_rec", None)
    if rec is not None:
        rec["idx"].extend(int(j) for j in (i if isinstance(i, (list, tuple)) else [i]))
        _cur[0] = rec
    return i


_dl._BaseDataLoaderIter._next_index = _next_index_rec
_backward = torch.autograd.backward


def _backward_rec(*a, **k):
    _state["backward"] += 1
    if _cur[0] is not None:
        _cur[0]["backward"] += 1
    return _backward(*a, **k)


torch.autograd.backward = _backward_rec
_opt_init = torch.optim.Optimizer.__init__


def _optim_init(self, *a, **k):
    _opt_init(self, *a, **k)
    if not any(o is self for o in _optims):
        _optims.append(self)


torch.optim.Optimizer.__init__ = _optim_init


def _step_hook(opt, args, kwargs):
    _steps[id(opt)] = _steps.get(id(opt), 0) + 1


import torch.optim.optimizer as _optmod  # noqa: E402

_optmod.register_optimizer_step_post_hook(_step_hook)
_save = torch.save


def _save_rec(obj, f, *a, **k):
    if isinstance(f, (str, os.PathLike)):
        _saves.append(os.path.abspath(os.fspath(f)))
    return _save(obj, f, *a, **k)


torch.save = _save_rec
_open = builtins.open
_writes = []


def _open_rec(file, mode="r", *a, **k):
    if isinstance(file, (str, os.PathLike)) and any(c in mode for c in "wax"):
        path = os.path.abspath(os.fspath(file))
        if not path.startswith("/dev/") and not (_DIR and path.startswith(os.path.abspath(_DIR))):
            _writes.append(path)
    return _open(file, mode, *a, **k)


builtins.open = _open_rec


def _dump():
    if not _DIR:
        return
    opts = []
    for o in _optims:
        ps = [p.detach().double().cpu().reshape(-1) for g in o.param_groups for p in g["params"]]
        flat = torch.cat(ps) if ps else torch.zeros(0, dtype=torch.float64)
        opts.append({"n": flat.numel(), "sum": float(flat.sum()), "abs": float(flat.abs().sum()),
                     "sha": hashlib.sha1(flat.float().numpy().tobytes()).hexdigest()[:16],
                     "steps": _steps.get(id(o), 0)})
    os.makedirs(_DIR, exist_ok=True)
    with open(os.path.join(_DIR, "rank%d.json" % _RANK), "w") as f:
        json.dump({"rank": _RANK, "world": int(os.environ.get("WORLD_SIZE", "1")),
                   "passes": _passes, "optimizers": opts, "saves": _saves, "writes": sorted(set(_writes)),
                   "backward": _state["backward"]}, f)


atexit.register(_dump)
