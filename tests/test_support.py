"""tests/support/rank_log.py, which every script run of the suite goes through:
it leaves by ``os._exit`` (see its docstring), so it must give the exit status,
the output and the files that ``python SCRIPT`` would."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import RANK_LOG, script_env

SCRIPT = '''\
import atexit
import sys
import threading
import time

what = sys.argv[1]
log = open("left_open.txt", "w")  # never closed: the interpreter would flush it
log.write("written, never closed\\n")
atexit.register(lambda: open("atexit.txt", "w").write("ran\\n"))


class Proxy:  # (werkzeug's LocalProxy: reading its __class__ raises when unbound)
    @property
    def __class__(self):
        raise RuntimeError("unbound")


proxy = Proxy()


def late():
    time.sleep(0.3)
    open("thread.txt", "w").write("done\\n")


threading.Thread(target=late).start()  # not a daemon: waited for
print("argv", sys.argv)
if what == "exit3":
    sys.exit(3)
if what == "message":
    sys.exit("a message")
if what == "raise":
    raise ValueError("boom")
'''


@pytest.mark.parametrize(
    "what, code, output",
    [("ok", 0, "argv"), ("exit3", 3, "argv"), ("message", 1, "a message"), ("raise", 1, "ValueError: boom")],
)
def test_rank_log_leaves_as_the_interpreter_would(tmp_path, what, code, output):
    (tmp_path / "job.py").write_text(SCRIPT)
    for mode in (["job.py"], ["-m", "job"]) if what == "ok" else (["job.py"],):
        for name in ("left_open.txt", "atexit.txt", "thread.txt"):
            (tmp_path / name).unlink(missing_ok=True)
        env = dict(script_env(tmp_path), PYTHONWARNINGS="error::FutureWarning")  # none at the exit either
        run = subprocess.run(
            [sys.executable, str(RANK_LOG), *mode, what], cwd=tmp_path, env=env,
            capture_output=True, text=True, timeout=120,
        )
        assert run.returncode == code, run.stdout + run.stderr
        assert output in run.stdout + run.stderr
        assert "Warning" not in run.stderr and "unbound" not in run.stderr, run.stderr
        assert f"argv ['{tmp_path / 'job.py'}', '{what}']" in run.stdout  # as `python job.py` / `-m job`
        assert (tmp_path / "left_open.txt").read_text() == "written, never closed\n"
        assert (tmp_path / "atexit.txt").read_text() == "ran\n"
        assert (tmp_path / "thread.txt").read_text() == "done\n"


HALF_DISTRIBUTED = b"""import os
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

dist.init_process_group("gloo")
torch.manual_seed(int(os.environ["RANK"]))  # each rank its own weights, and no DDP to sync them
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = TensorDataset(torch.randn(16, 4), torch.randn(16, 2))
for epoch in range(2):
    for x, y in DataLoader(data, batch_size=4):  # no DistributedSampler: every rank reads it all
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    for x, y in DataLoader(data, batch_size=8):  # an evaluation pass: not a training epoch
        with torch.no_grad():
            model(x)
dist.destroy_process_group()
"""


def test_the_judgement_of_a_run_sees_ranks_apart_and_data_not_sharded(tmp_path):
    """What the converted fixtures are judged by can fail: a script that trains
    unsynchronised copies on the whole data set on every rank fails both checks."""
    from conftest import run_script

    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_bytes(HALF_DISTRIBUTED)
    run = run_script(work, "train.py", [], distributed=True)
    assert run.returncode == 0, run.output[-3000:]
    assert len(run.states) == 2 and all(len(s["epochs"]) == 2 for s in run.states), run.states
    assert "differ by" in (run.ranks_in_sync() or "")
    assert "16 indices in common" in (run.training_sharded() or "")
