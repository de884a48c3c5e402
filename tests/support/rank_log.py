"""Run a training script and log which process wrote which file.

    python rank_log.py [--cuda-shim] (SCRIPT | -m MODULE) ARGS...
    torchrun ... rank_log.py (SCRIPT | -m MODULE) ARGS...

Each process appends {"rank": RANK or null, "path": absolute path} lines to
``$DP2DDP_WRITE_LOG.<rank>.jsonl``: for ``torch.save``, for ``open()`` in a mode
that writes, and for the target of ``shutil.copy*``/``shutil.move``/``os.replace``/
``os.rename`` -- files under the folder the script runs in (not torch's caches).  The script runs as ``__main__`` with its own
folder first on ``sys.path``, exactly as ``python SCRIPT`` would run it.

``--cuda-shim`` lets an original script that calls ``.cuda()`` unconditionally
run on a CPU-only machine (``Tensor.cuda``/``Module.cuda`` return the object
unchanged); it is only ever used for originals, never for converted scripts.

When the script is done, the process leaves as the interpreter would -- waiting
for the script's threads, running its ``atexit`` functions, flushing the files it
left open -- but through ``os._exit`` with the script's exit status, skipping the
interpreter's final teardown (as ``dp2ddp verify``'s ranks do).  In that teardown a
Gloo worker thread still freeing the last work of a backward pass (it holds a
Python object, the autograd context) takes the GIL of a finalizing interpreter and
the process aborts ("terminate called without an active exception", SIGABRT)
after the script has finished -- PyTorch's bug (pytorch/pytorch#190489), seen in
about one short converted run in twenty here, barrier or not.
"""

import atexit
import gc
import io
import json
import os
import runpy
import sys
import threading
import warnings


def main() -> None:
    args = sys.argv[1:]
    shim = args and args[0] == "--cuda-shim"
    if shim:
        args = args[1:]
    module = args[1] if args[0] == "-m" else None
    if module:
        args = args[1:]
    script = None if module else os.path.abspath(args[0])
    rank = os.environ.get("RANK")
    log_path = f"{os.environ['DP2DDP_WRITE_LOG']}.{rank if rank is not None else 'single'}.jsonl"

    import builtins
    import shutil

    import torch

    here = os.path.abspath(os.getcwd())
    real_open = builtins.open

    def log(f) -> None:
        path = os.path.abspath(os.fspath(f)) if isinstance(f, (str, os.PathLike)) else getattr(f, "name", repr(f))
        if isinstance(f, (str, os.PathLike)) and not str(path).startswith(here + os.sep):
            return  # (a cache outside the run's folder)
        with real_open(log_path, "a") as handle:
            handle.write(json.dumps({"rank": rank, "path": str(path)}) + "\n")

    original_save = torch.save

    def logged_save(obj, f, *a, **k):
        log(f)
        return original_save(obj, f, *a, **k)

    def logged_open(file, mode="r", *a, **k):
        if isinstance(file, (str, os.PathLike)) and any(c in mode for c in "wax+"):
            log(file)
        return real_open(file, mode, *a, **k)

    def logged_target(function, index=1):
        def wrapper(*a, **k):
            if len(a) > index:
                log(a[index])
            return function(*a, **k)

        return wrapper

    torch.save = logged_save
    builtins.open = io.open = logged_open
    _record_training(torch, f"{os.environ['DP2DDP_WRITE_LOG']}.{rank if rank is not None else 'single'}.state.json")
    for name in ("copy", "copy2", "copyfile", "move"):
        setattr(shutil, name, logged_target(getattr(shutil, name)))
    os.replace, os.rename = logged_target(os.replace), logged_target(os.rename)
    if shim:
        torch.Tensor.cuda = lambda self, *a, **k: self
        torch.nn.Module.cuda = lambda self, *a, **k: self
    if module:  # as `python -m MODULE`: the current folder first on sys.path
        sys.argv = [module, *args[1:]]
        sys.path.insert(0, os.getcwd())
        _leave(_run(lambda: runpy.run_module(module, run_name="__main__", alter_sys=True)))
    sys.argv = [script, *args[1:]]
    sys.path.insert(0, os.path.dirname(script))
    _leave(_run(lambda: runpy.run_path(script, run_name="__main__")))


_STATE = {"path": None, "optimizers": [], "passes": [], "backwards": 0}


def _record_training(torch, path: str) -> None:
    """What the test judges a converted run by, written when the script is done:
    each optimizer's parameters (equal on every rank when DDP keeps them in sync)
    and, for each pass over a DataLoader in which ``backward()`` ran (a training
    epoch), the dataset indices it drew (disjoint between ranks when sharded)."""
    _STATE["path"] = path
    optimizer_init = torch.optim.Optimizer.__init__

    def init(self, *a, **k):
        optimizer_init(self, *a, **k)
        _STATE["optimizers"].append(self)

    torch.optim.Optimizer.__init__ = init
    for name in ("backward",):
        tensor_backward = getattr(torch.Tensor, name)

        def backward(self, *a, _real=tensor_backward, **k):
            _STATE["backwards"] += 1
            return _real(self, *a, **k)

        setattr(torch.Tensor, name, backward)
    autograd_backward = torch.autograd.backward

    def backward_function(*a, **k):
        _STATE["backwards"] += 1
        return autograd_backward(*a, **k)

    torch.autograd.backward = backward_function
    from torch.utils.data import dataloader

    iter_init = dataloader._BaseDataLoaderIter.__init__
    next_index = dataloader._BaseDataLoaderIter._next_index

    def started(self, *a, **k):
        iter_init(self, *a, **k)
        self._dp2ddp_pass = {"indices": [], "start": _STATE["backwards"]}
        _STATE["passes"].append(self._dp2ddp_pass)

    def drawn(self):
        index = next_index(self)
        record = getattr(self, "_dp2ddp_pass", None)
        if record is not None:
            record["indices"].extend(index if isinstance(index, (list, tuple)) else [index])
        return index

    dataloader._BaseDataLoaderIter.__init__ = started
    dataloader._BaseDataLoaderIter._next_index = drawn


def _write_state() -> None:
    if _STATE["path"] is None:
        return
    try:
        import torch

        params = []
        for optimizer in _STATE["optimizers"]:
            flat = [p.detach().double().flatten().cpu() for g in optimizer.param_groups for p in g["params"]]
            params.append(torch.cat(flat).tolist() if flat else [])
        passes = _STATE["passes"]
        ends = [later["start"] for later in passes[1:]] + [_STATE["backwards"]]
        epochs = [  # the passes until the next one began during which backward() ran
            [int(i) for i in record["indices"] if isinstance(i, int)]
            for record, end in zip(passes, ends)
            if end > record["start"]
        ]
        with io.open(_STATE["path"], "w") as handle:
            json.dump({"rank": os.environ.get("RANK"), "params": params, "epochs": epochs}, handle)
    except Exception as exc:  # (the judgement then says it has no state: never a crash here)
        print(f"rank_log: could not record the training state: {exc!r}", file=sys.stderr)


def _run(script) -> int:
    """The exit status ``python SCRIPT`` would have: 0, SystemExit's, or 1 after a traceback."""
    try:
        script()
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException as exc:
        sys.excepthook(*sys.exc_info())
        return 130 if isinstance(exc, KeyboardInterrupt) else 1
    return 0


def _leave(code: int) -> None:
    """What the interpreter does on the way out, then ``os._exit`` (see above)."""
    threading._shutdown()  # the script's own (non-daemon) threads
    atexit._run_exitfuncs()
    _write_state()
    with warnings.catch_warnings():  # (a file object's .closed may warn or raise)
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():  # files the script left open
            try:
                if issubclass(type(obj), io.IOBase) and not obj.closed:
                    obj.flush()
            except Exception:
                pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
