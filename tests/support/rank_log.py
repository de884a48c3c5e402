"""Run a training script and log which process wrote which file with torch.save.

    python rank_log.py [--cuda-shim] SCRIPT ARGS...
    torchrun ... rank_log.py SCRIPT ARGS...

Each process appends {"rank": RANK or null, "path": absolute path} lines to
``$DP2DDP_WRITE_LOG.<rank>.jsonl``.  The script runs as ``__main__`` with its own
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

    import torch

    original_save = torch.save

    def logged_save(obj, f, *a, **k):
        path = os.path.abspath(os.fspath(f)) if isinstance(f, (str, os.PathLike)) else getattr(f, "name", repr(f))
        with open(log_path, "a") as handle:
            handle.write(json.dumps({"rank": rank, "path": str(path)}) + "\n")
        return original_save(obj, f, *a, **k)

    torch.save = logged_save
    if shim:
        torch.Tensor.cuda = lambda self, *a, **k: self
        torch.nn.Module.cuda = lambda self, *a, **k: self
    sys.argv = [script, *args[1:]]
    sys.path.insert(0, os.path.dirname(script))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
