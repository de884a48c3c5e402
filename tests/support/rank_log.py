"""Run a training script and log which process wrote which file.

    python rank_log.py [--cuda-shim] SCRIPT ARGS...
    torchrun ... rank_log.py SCRIPT ARGS...

Each process appends {"rank": RANK or null, "path": absolute path} lines to
``$DP2DDP_WRITE_LOG.<rank>.jsonl``: for ``torch.save``, for ``open()`` in a mode
that writes, and for the target of ``shutil.copy*``/``shutil.move``/``os.replace``/
``os.rename`` -- files under the folder the script runs in (not torch's caches).  The script runs as ``__main__`` with its own
folder first on ``sys.path``, exactly as ``python SCRIPT`` would run it.

``--cuda-shim`` lets an original script that calls ``.cuda()`` unconditionally
run on a CPU-only machine (``Tensor.cuda``/``Module.cuda`` return the object
unchanged); it is only ever used for originals, never for converted scripts.
"""

import json
import os
import runpy
import sys


def main() -> None:
    args = sys.argv[1:]
    shim = args and args[0] == "--cuda-shim"
    if shim:
        args = args[1:]
    script = os.path.abspath(args[0])
    rank = os.environ.get("RANK")
    log_path = f"{os.environ['DP2DDP_WRITE_LOG']}.{rank if rank is not None else 'single'}.jsonl"

    import builtins
    import io
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
    for name in ("copy", "copy2", "copyfile", "move"):
        setattr(shutil, name, logged_target(getattr(shutil, name)))
    os.replace, os.rename = logged_target(os.replace), logged_target(os.rename)
    if shim:
        torch.Tensor.cuda = lambda self, *a, **k: self
        torch.nn.Module.cuda = lambda self, *a, **k: self
    sys.argv = [script, *args[1:]]
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
