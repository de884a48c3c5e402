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
