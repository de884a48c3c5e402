"""Signals to a run with worker processes (-j 2): no worker outlives the main
process, Ctrl-C stops the run at once and says the truth about the files."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from conftest import FIXTURES, ROOT

SCRIPT = FIXTURES / "e2e" / "dp_classifier" / "before" / "train.py"


def _children(pid: int) -> List[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _programs(tmp_path: Path, count: int) -> Path:
    """``count`` DataParallel training scripts (about a second of conversion each)."""
    root = tmp_path / "repo"
    for index in range(count):
        folder = root / f"p{index}"
        folder.mkdir(parents=True)
        shutil.copy(SCRIPT, folder / "train.py")
    return root


def _ctrl_c_as_on_a_terminal() -> None:
    """(In the child, before exec.)  A job started in the background by a shell
    without job control -- ``bash .ci/run &`` -- ignores SIGINT, and an ignored
    signal stays ignored through fork and exec: every run these tests start would
    ignore the Ctrl-C they send.  A terminal's foreground job does not."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(args, cwd: Path) -> subprocess.Popen:
    """The run, its output into files (a worker left behind would hold a pipe open)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", DP2DDP_NO_CACHE="1")
    with open(cwd / "stdout", "wb") as out, open(cwd / "stderr", "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "dp2ddp", *args], cwd=cwd, env=env, start_new_session=True,
            stdout=out, stderr=err, preexec_fn=_ctrl_c_as_on_a_terminal,
        )


def _kill(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _wait_for_workers(proc: subprocess.Popen, count: int = 2, timeout: float = 60.0) -> List[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail("the run ended before its workers were seen")
        workers = _children(proc.pid)
        if len(workers) >= count:
            time.sleep(0.3)  # (busy on a file by now)
            return _children(proc.pid)
        time.sleep(0.05)
    pytest.fail("no worker processes appeared")


def _gone_within(pids: List[int], seconds: float) -> List[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _lint_corpus(tmp_path: Path) -> Path:
    """Enough large files that a lint -j 2 runs for seconds (it needs 64 files for a pool)."""
    root = tmp_path / "lint"
    root.mkdir()
    body = SCRIPT.read_text()
    big = body + "\n".join(
        f"def step_{i}(model, x):\n    y = model(x)\n    torch.save(model.state_dict(), 'ck{i}.pt')\n    return y\n"
        for i in range(1500)
    )
    for index in range(200):
        (root / f"m{index}.py").write_text(big)
    return root


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
@pytest.mark.parametrize("command", ["convert", "lint"])
def test_killing_the_main_process_leaves_no_worker(tmp_path, sig, command):
    if command == "convert":
        proc = _start(["convert", "--check", "-j", "2", str(_programs(tmp_path, 8))], tmp_path)
    else:
        proc = _start(["lint", "--no-config", "-j", "2", str(_lint_corpus(tmp_path))], tmp_path)
    workers: List[int] = []
    try:
        workers = _wait_for_workers(proc)
        os.kill(proc.pid, sig)
        proc.wait(10)
        assert proc.returncode == -sig
        left = _gone_within(workers, 5.0)
        assert not left, f"workers {left} still running after the main process got {sig.name}"
    finally:
        _kill([proc.pid, *workers, *_children(proc.pid)])
        proc.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_worker_killed_from_outside_ends_the_run_instead_of_hanging_it(tmp_path):
    """(the out-of-memory killer): a pool that waited for the lost job forever
    would hang; the run ends, says so, and leaves no worker behind."""
    proc = _start(["convert", "--check", "-j", "2", str(_programs(tmp_path, 8))], tmp_path)
    workers: List[int] = []
    try:
        workers = _wait_for_workers(proc)
        os.kill(workers[0], signal.SIGKILL)
        proc.wait(20)
        left = _gone_within(workers, 5.0)
    finally:
        _kill([proc.pid, *workers, *_children(proc.pid)])
        proc.wait()
    err = (tmp_path / "stderr").read_text()
    assert proc.returncode == 123, err
    assert "internal error" in err and "terminated abruptly" in err
    assert not left


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("mode", ["--check", "--write"])
def test_ctrl_c_stops_a_conversion_at_once(tmp_path, mode):
    # (enough files that a pool which finished its queue before stopping took seconds)
    root = _programs(tmp_path, 40)
    args = ["convert", mode, "-j", "2", str(root)]
    proc = _start(args + (["--allow-dirty"] if mode == "--write" else []), tmp_path)
    workers: List[int] = []
    try:
        workers = _wait_for_workers(proc)
        started = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal does: the whole foreground group
        proc.wait(30)
        took = time.monotonic() - started
        left = _gone_within(workers, 2.0)
    finally:
        _kill([proc.pid, *workers, *_children(proc.pid)])
        proc.wait()
    err = (tmp_path / "stderr").read_text()
    assert proc.returncode == 130, err
    assert took < 2.0, f"Ctrl-C took {took:.1f} s to stop the run"
    assert not left, f"workers {left} still running after Ctrl-C"
    assert "Traceback" not in err
    if mode == "--check":
        assert "fully written" not in err
        assert "nothing was written" in err
    else:
        assert "either as it was or fully written" in err
    # (the conversion was stopped before its writes: every file is as it was)
    assert all(p.read_bytes() == SCRIPT.read_bytes() for p in root.rglob("*.py"))


def _killed_while_writing(path: Path) -> Path:
    """Run ``write_atomic(path)`` in a process that SIGKILL stops before its
    rename; returns the temporary file it left."""
    code = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from dp2ddp import files\n"
        "os.replace = lambda *args: os.kill(os.getpid(), signal.SIGKILL)\n"
        "files.write_atomic(Path(sys.argv[1]), b'half of a conversion')\n"
    )
    before = set(path.parent.iterdir())
    proc = subprocess.run([sys.executable, "-c", code, str(path)])
    assert proc.returncode == -signal.SIGKILL
    (left,) = set(path.parent.iterdir()) - before
    assert left.name.startswith(f".{path.name}.") and left.name.endswith(".dp2ddp.tmp")
    return left


@pytest.mark.parametrize("command", ["convert", "lint"])
def test_a_write_killed_before_its_rename_is_cleaned_up_by_the_next_write(tmp_path, command):
    root = _programs(tmp_path, 2)
    left = _killed_while_writing(root / "p0" / "train.py")
    # what is not ours, or not in the paths given, stays
    elsewhere = _killed_while_writing(_programs(tmp_path / "other", 1) / "p0" / "train.py")
    foreign = root / "p1" / ".notes.txt.abcd1234.dp2ddp.tmp"  # (no notes.txt is converted)
    foreign.write_text("not ours")
    live = root / "p1" / f".train.py.{os.getpid()}-abcd1234.dp2ddp.tmp"  # (a writer still running)
    live.write_text("being written")
    env = dict(os.environ, OMP_NUM_THREADS="1", DP2DDP_NO_CACHE="1")
    check = ["convert", "--check"] if command == "convert" else ["lint", "--no-config"]
    proc = subprocess.run([sys.executable, "-m", "dp2ddp", *check, str(root)], env=env, capture_output=True, text=True)
    assert left.exists(), "a run that writes nothing removed a file"
    write = ["convert", "--write"] if command == "convert" else ["lint", "--no-config", "--fix"]
    proc = subprocess.run([sys.executable, "-m", "dp2ddp", *write, str(root)], env=env, capture_output=True, text=True)
    assert not left.exists(), proc.stderr
    assert f"removed {left}: left by an interrupted write" in proc.stderr
    assert elsewhere.exists() and foreign.exists() and live.exists()
    assert b"half of a conversion" not in (root / "p0" / "train.py").read_bytes()


def _through_a_pty(args, cwd: Path, env_extra=None) -> tuple:
    """Run dp2ddp with stderr on a terminal (a pty); (exit code, what the terminal showed)."""
    import pty
    import threading

    master, slave = pty.openpty()
    import fcntl
    import struct
    import termios

    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # (a new pty is 0x0)
    env = dict(os.environ, OMP_NUM_THREADS="1", DP2DDP_NO_CACHE="1", TERM="xterm", COLUMNS="100")
    env.pop("CI", None)
    env.update(env_extra or {})
    shown = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # (the terminal's other side is closed)
                return
            if not chunk:
                return
            shown.extend(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "dp2ddp", *args], cwd=cwd, env=env, stderr=slave,
            stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, timeout=300,
        )
    finally:
        os.close(slave)
        reader.join(10)
        os.close(master)
    return proc.returncode, shown.decode("utf-8", "replace")


def test_progress_on_a_terminal_only(tmp_path):
    root = _programs(tmp_path, 6)
    code, shown = _through_a_pty(["convert", "--check", "-j", "1", str(root)], tmp_path)
    assert code == 1, shown
    assert "dp2ddp: converting" in shown and "/6" in shown and "files" in shown, shown
    # the bar is erased: the summary is what the last line shows
    assert shown.rstrip().split("\r\n")[-1].split("\r")[-1] == "6 files would be converted, 0 left unchanged."
    root = _programs(tmp_path / "two", 2)  # (still longer than the bar's half-second delay)
    code, shown = _through_a_pty(["convert", "--check", "-j", "1", "-q", str(root)], tmp_path)
    assert "dp2ddp: converting" not in shown
    code, shown = _through_a_pty(["convert", "--check", "-j", "1", str(root)], tmp_path, {"CI": "true"})
    assert code == 1 and "dp2ddp: converting" not in shown
    # piped: nothing but the report
    env = dict(os.environ, OMP_NUM_THREADS="1", DP2DDP_NO_CACHE="1")
    env.pop("CI", None)
    proc = subprocess.run(
        [sys.executable, "-m", "dp2ddp", "convert", "--check", "-j", "1", str(root)], cwd=tmp_path, env=env,
        capture_output=True, text=True,
    )
    assert proc.returncode == 1 and "dp2ddp: converting" not in proc.stderr and "\r" not in proc.stderr


def test_lint_progress_on_a_terminal(tmp_path):
    root = _lint_corpus(tmp_path)
    code, shown = _through_a_pty(["lint", "--no-config", "-j", "1", str(root)], tmp_path)
    assert code == 1
    assert "dp2ddp: linting" in shown and "/200" in shown, shown[-2000:]
    code, shown = _through_a_pty(["lint", "--no-config", "-j", "1", str(root)], tmp_path, {"CI": "true"})
    assert code == 1 and "dp2ddp: linting" not in shown


POOL_INTERRUPTED = """
import os, signal, sys, threading
from dp2ddp.workers import worker_pool

def big(i):
    return b"x" * 8_000_000  # far more than a pipe holds: each result is written in parts

threading.Timer({delay}, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
try:
    with worker_pool(2) as pool:
        for _ in pool.imap(big, range(400)):
            pass
except KeyboardInterrupt:
    sys.exit(130)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork and /proc")
@pytest.mark.parametrize("delay", [0.3, 0.7])
def test_ctrl_c_while_a_worker_writes_a_large_result(tmp_path, delay):
    """A worker killed in the middle of writing its result left half a message in
    the result pipe; the pool's manager thread waited for the rest forever, and the
    interpreter for that thread at exit: Ctrl-C hung the run (CI).  Now the run
    ends at once, and quietly."""
    script = tmp_path / "pool.py"
    script.write_text(POOL_INTERRUPTED.format(delay=delay))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    with open(tmp_path / "stderr", "wb") as err:
        proc = subprocess.Popen([sys.executable, str(script)], env=env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=err, preexec_fn=_ctrl_c_as_on_a_terminal)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail("the interrupted pool never let the process exit")
    err = (tmp_path / "stderr").read_text()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "Exception in thread" not in err, err
