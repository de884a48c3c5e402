"""Start the ranks of a verify run, watch them, stop them.

Two launchers:

* ``fork`` (one machine, the default): the coordinator imports torch once and
  forks the ranks, giving each the environment torchrun gives its workers
  (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` of a
  store the coordinator hosts on a free port, ``TORCHELASTIC_USE_AGENT_STORE``).
  It saves the second import of torch in every rank: about half of a small run.
* ``torchrun`` (``--nnodes M`` simulates M machines on this one): one
  ``torchrun`` agent per node with c10d rendezvous on 127.0.0.1, so that ranks
  of node 1 have ``LOCAL_RANK`` 0..N-1 and global ranks N..2N-1.

Every rank runs ``dp2ddp.verify.harness``, in its own session (process group),
so that stopping a run kills everything it started.  A rank is *stalled* when no
rank has shown progress (a batch, an optimizer step) for ``timeout`` seconds;
then every live rank dumps its Python stack (SIGUSR1, faulthandler) and the run
is torn down.
"""

from __future__ import annotations

import os
import signal
from contextlib import contextmanager
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from dp2ddp.verify import harness as H


@dataclass
class Launched:
    """What the coordinator watches: the processes and how the run ended."""

    pids: List[int] = field(default_factory=list)  # fork: the ranks; torchrun: the agents
    popens: List[subprocess.Popen] = field(default_factory=list)
    exit_codes: Dict[int, int] = field(default_factory=dict)
    stalled: bool = False
    crashed: bool = False
    duration: float = 0.0
    #: every process seen below the ranks (pid -> its start time), see ``Descendants``
    family: "Descendants" = field(default_factory=lambda: Descendants(""))
    #: processes the script started outside the ranks' process groups, stopped at the end
    escaped: List[str] = field(default_factory=list)


def _stat(pid: int) -> Optional[tuple]:
    """(ppid, process group, session, start time) of ``pid``, from /proc; None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()  # (the command may hold spaces and parentheses)
    return int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19])


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()[:80]
    except OSError:
        return "?"


class Descendants:
    """The processes a run started, however far they got from the ranks: a child in
    a session of its own (``Popen(start_new_session=True)``, a daemon) escapes the
    ranks' process groups, and once its rank has exited it is no longer its child
    either.  So the family is followed as it grows (``scan``, while the run is
    watched: children, their children, anything in a rank's process group or
    session), and at the end every process whose environment carries the run's
    folder (``DP2DDP_VERIFY_DIR``, inherited through exec) joins it.  A pid is
    remembered with its start time: a pid the kernel gave to another process since
    is not the same process.  Linux (/proc); elsewhere nothing is found."""

    def __init__(self, directory: str) -> None:
        self.marker = f"{H.ENV_DIR}={directory}".encode() if directory else None
        self.seen: Dict[int, int] = {}
        self.groups: Dict[int, int] = {}

    def scan(self, roots, environ: bool = False) -> None:
        if not os.path.isdir("/proc"):
            return
        table = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                stat = _stat(int(name))
                if stat is not None:
                    table[int(name)] = stat
        roots = set(roots)
        outside = {os.getpid(), os.getppid(), 1}
        family = {p for p in roots | set(self.seen) if p in table and self.seen.get(p, table[p][3]) == table[p][3]}
        grew = True
        while grew:
            grew = False
            for pid, (ppid, pgrp, session, _) in table.items():
                if pid not in family and pid not in outside and (ppid in family or pgrp in roots or session in roots):
                    family.add(pid)
                    grew = True
        if environ and self.marker:
            for pid in set(table) - family - outside:
                try:
                    with open(f"/proc/{pid}/environ", "rb") as handle:
                        if self.marker in handle.read().split(b"\0"):
                            family.add(pid)
                except OSError:
                    continue  # another user's, or gone
        for pid in family - outside:
            self.seen.setdefault(pid, table[pid][3])
            self.groups.setdefault(pid, table[pid][1])

    def alive(self) -> List[int]:
        """The family's processes still running (the same process: same start time)."""
        return [p for p, start in self.seen.items() if (_stat(p) or (0, 0, 0, None))[3] == start]

    def signal(self, sig) -> None:
        for pid in self.alive():
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env(directory: str, options) -> Dict[str, str]:
    env = {
        H.ENV_DIR: directory,
        H.ENV_MAX_STEPS: str(options.max_steps),
        H.ENV_EPOCH_BATCHES: str(options.epoch_batches),
        H.ENV_TIMEOUT: str(options.timeout),
        H.ENV_MODE: "distributed",
        "PYTHONUNBUFFERED": "1",
    }
    env.setdefault("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    if os.environ.get("TORCH_DISTRIBUTED_DEBUG") == "DETAIL":
        # DETAIL crashes inside DDP.__init__ in some builds (seen with 2.13 CPU); INFO works
        env["TORCH_DISTRIBUTED_DEBUG"] = "INFO"
    if options.deterministic:
        env[H.ENV_DETERMINISTIC] = "1"
    return env


def _fresh_random_state() -> None:
    """A forked rank starts with its parent's random state, where a process that
    torchrun starts draws a seed of its own (torch, Python's ``random`` and numpy
    all seed themselves from the OS): reseeded alike, so that an unseeded
    ``random_split`` or shuffle differs between ranks here as it does there."""
    import random

    import torch

    torch.seed()
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def fork_ranks(directory: str, options, cwd: str, launched: Launched) -> Launched:
    """One machine: fork ``nproc`` ranks from this (torch-importing) process.
    ``launched`` gets each process as it starts (stopped if this is interrupted)."""
    import torch  # noqa: F401  - imported once, before forking
    import torch.distributed as dist

    nproc = options.nproc_per_node
    base_env = _env(directory, options)
    run_id = uuid.uuid4().hex[:8]
    pipes = []
    sys.stdout.flush()
    sys.stderr.flush()
    for local_rank in range(nproc):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the rank
            try:
                os.close(write_end)
                os.setsid()
                port = int(os.read(read_end, 32).decode() or "0")
                os.close(read_end)
                if port == 0:
                    os._exit(3)
                os.environ.update(base_env)
                os.environ.update(
                    RANK=str(local_rank),
                    LOCAL_RANK=str(local_rank),
                    WORLD_SIZE=str(nproc),
                    LOCAL_WORLD_SIZE=str(nproc),
                    GROUP_RANK="0",
                    GROUP_WORLD_SIZE="1",
                    ROLE_RANK=str(local_rank),
                    ROLE_WORLD_SIZE=str(nproc),
                    ROLE_NAME="default",
                    MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port),
                    TORCHELASTIC_USE_AGENT_STORE="True",
                    TORCHELASTIC_RUN_ID=run_id,
                    TORCHELASTIC_RESTART_COUNT="0",
                    TORCHELASTIC_MAX_RESTARTS="0",
                )
                log = os.open(
                    os.path.join(directory, f"rank{local_rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644
                )
                os.dup2(log, 1)
                os.dup2(log, 2)
                # Python-level streams on those descriptors too: the parent's may be
                # replaced (pytest's capture, a notebook) and would swallow the output
                sys.stdout = open(1, "w", buffering=1, closefd=False)
                sys.stderr = open(2, "w", buffering=1, closefd=False)
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.chdir(cwd)
                _fresh_random_state()
                H.main([options.script, *options.args])
            finally:
                H._REAL_EXIT(1)
        os.close(read_end)
        pipes.append(write_end)
        launched.pids.append(pid)
    # the rendezvous store, on a port the kernel picked (no fixed port, no race)
    store = dist.TCPStore("127.0.0.1", 0, world_size=nproc, is_master=True, wait_for_workers=False)
    for write_end in pipes:
        os.write(write_end, str(store.port).encode())
        os.close(write_end)
    launched.store = store  # type: ignore[attr-defined]  - keep it alive
    return launched


def torchrun_nodes(directory: str, options, cwd: str, launched: Launched) -> Launched:
    """``nnodes`` torchrun agents on this machine, c10d rendezvous on 127.0.0.1."""
    env = dict(os.environ)
    env.update(_env(directory, options))
    port = free_port()
    run_id = f"verify-{uuid.uuid4().hex[:8]}"
    for node in range(options.nnodes):
        cmd = [sys.executable, "-m", "torch.distributed.run"]
        if options.nnodes == 1:
            cmd += ["--standalone"]
        else:
            cmd += [
                f"--nnodes={options.nnodes}",
                "--rdzv_backend=c10d",
                f"--rdzv_endpoint=127.0.0.1:{port}",
                f"--rdzv_id={run_id}",
                f"--rdzv_conf=is_host={'true' if node == 0 else 'false'}",
            ]
        cmd += [
            f"--nproc_per_node={options.nproc_per_node}",
            "--max_restarts=0",
            "--monitor_interval=0.2",
            "-m",
            "dp2ddp.verify.harness",
            options.script,
            *options.args,
        ]
        log = open(os.path.join(directory, f"node{node}.log"), "wb")
        popen = subprocess.Popen(
            cmd, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        launched.popens.append(popen)
        launched.pids.append(popen.pid)
    return launched


def rank_pids(directory: str) -> Dict[str, int]:
    """The pid each rank reported in its record ("start" event)."""
    import json

    pids = {}
    for name in os.listdir(directory):
        if name.endswith(".jsonl"):
            with open(os.path.join(directory, name)) as handle:
                for line in handle:
                    try:
                        event = json.loads(line)
                    except ValueError:
                        continue
                    if event.get("event") == "start":
                        pids[name[: -len(".jsonl")]] = event["pid"]
                        break
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _last_progress(directory: str, started: float) -> float:
    latest = started
    for name in os.listdir(directory):
        if name.endswith(".alive"):
            try:
                latest = max(latest, os.path.getmtime(os.path.join(directory, name)))
            except OSError:
                pass
    return latest


def watch(directory: str, launched: Launched, options, started: float) -> Launched:
    """Wait for the run to end: all done, a crash, or a stall."""
    pending = set(launched.pids)
    crash_seen_at: Optional[float] = None
    scanned = 0.0
    while pending:
        if time.time() - scanned > 0.5:  # the processes the ranks start, while their parents live
            launched.family.scan(set(launched.pids) | set(rank_pids(directory).values()))
            scanned = time.time()
        for pid in list(pending):
            code = _reap(pid, launched)
            if code is not None:
                pending.discard(pid)
                launched.exit_codes[pid] = code
                if code != 0 and crash_seen_at is None:
                    crash_seen_at = time.time()
                    launched.crashed = True
        if not pending:
            break
        now = time.time()
        if crash_seen_at is not None and now - crash_seen_at > 3.0:
            # a rank died; the others are waiting for it in a collective
            _dump_stacks(directory)
            break
        if now - _last_progress(directory, started) > options.timeout:
            launched.stalled = True
            _dump_stacks(directory)
            break
        time.sleep(0.05)
    stop(launched, directory)
    launched.duration = time.time() - started
    return launched


def _reap(pid: int, launched: Launched) -> Optional[int]:
    for popen in launched.popens:
        if popen.pid == pid:
            code = popen.poll()
            return code
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return 0
    if done == 0:
        return None
    return os.waitstatus_to_exitcode(status)


def _dump_stacks(directory: str) -> None:
    for name, pid in rank_pids(directory).items():
        if _alive(pid) and hasattr(signal, "SIGUSR1"):
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
    time.sleep(1.0)


@contextmanager
def terminate_as_interrupt():
    """SIGTERM (``timeout``, a CI cancel, ``kill``) raises KeyboardInterrupt in the
    coordinator, like Ctrl-C, so that it stops the ranks it started (each leads its
    own session: nothing else reaches them) and removes its scratch folder."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop(launched: Launched, directory: str) -> None:
    """Kill everything the run started: each rank / agent leads its own session,
    and what escaped it (a child in a session of its own) is in ``launched.family``."""
    targets = set(launched.pids) | set(rank_pids(directory).values())
    family = launched.family
    if family.marker is None:
        family.marker = Descendants(directory).marker
    family.scan(targets, environ=True)
    # not in a rank's or agent's process group: killpg below would not reach it
    escaped = [p for p in family.alive() if p not in targets and family.groups.get(p) not in targets]
    launched.escaped = [f"pid {p}: {_command(p)}" for p in sorted(escaped)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        family.signal(sig)
        for pid in targets:
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.time() + 2.0
        while time.time() < deadline and (
            any(_alive(p) and not _zombie(p, launched) for p in targets) or _running(family.alive())
        ):
            time.sleep(0.05)
    for pid in launched.pids:
        _reap_blocking(pid, launched)


def _running(pids: List[int]) -> bool:
    """Some of ``pids`` (not this process's children) still runs: not a zombie."""
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        if data[data.rindex(b")") + 2 :].split()[0] != b"Z":
            return True
    return False


def _zombie(pid: int, launched: Launched) -> bool:
    for popen in launched.popens:
        if popen.pid == pid:
            return popen.poll() is not None
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    if done:
        launched.exit_codes.setdefault(pid, os.waitstatus_to_exitcode(status))
        return True
    return False


def _reap_blocking(pid: int, launched: Launched) -> None:
    for popen in launched.popens:
        if popen.pid == pid:
            try:
                popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            return
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
