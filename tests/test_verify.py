"""`dp2ddp verify`: a correct DDP script passes every check; a script with one
fault fails that check, with a useful message, within the timeout, and leaves no
process behind."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FIXTURES

SCRIPT = FIXTURES / "verify" / "train.py"


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return tmp_path


def run(fault: str = "", **kwargs):
    from dp2ddp.verify import VerifyOptions, verify

    options = VerifyOptions(
        script=str(SCRIPT),
        args=["--fault", fault] if fault else [],
        nproc_per_node=kwargs.pop("nproc_per_node", 2),
        keep=True,
        **{"timeout": 30.0, **kwargs},
    )
    report = verify(options)
    _assert_no_process_left(report.run_dir)
    shutil.rmtree(report.run_dir, ignore_errors=True)
    return report


def _assert_no_process_left(run_dir):
    pids = []
    for name in os.listdir(run_dir):
        if name.endswith(".jsonl"):
            first = json.loads(Path(run_dir, name).read_text().splitlines()[0])
            pids.append(first["pid"])
    assert pids
    deadline = time.time() + 5
    alive = pids
    while alive and time.time() < deadline:
        alive = [p for p in alive if _alive(p)]
        time.sleep(0.05)
    assert not alive, f"processes left behind: {alive}"


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of this process is not running
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"


def by_name(report):
    return {c.name: c for c in report.checks}


def test_correct_script_passes_every_check(workdir):
    # the user's own checkpoint where the script writes its own: neither
    # overwritten nor joined by the run's files (the ranks run in a scratch copy)
    (workdir / "checkpoint.pt").write_bytes(b"mine")
    report = run()
    checks = by_name(report)
    assert report.ok, [c.to_dict() for c in report.checks if c.status == "fail"]
    for name in ("process-group", "ddp-wrapped", "data-sharded", "set-epoch", "in-sync",
                 "single-writer", "no-hang", "no-crash"):
        assert checks[name].status == "pass", checks[name].to_dict()
    assert "backend gloo" in checks["process-group"].message
    assert "2 disjoint shards covering 256 of 256" in checks["data-sharded"].message
    assert "checkpoint.pt (rank 0)" in checks["single-writer"].message
    assert (workdir / "checkpoint.pt").read_bytes() == b"mine"
    assert sorted(os.listdir(workdir)) == ["checkpoint.pt"]


def test_writes_through_the_scratch_folders_links_never_reach_the_users_files(workdir):
    """Large files and folders are linked into the scratch folder: a write there
    first turns the links on its way into scratch copies (copy on write)."""
    big = workdir / "checkpoint.pt"
    with open(big, "wb") as handle:
        handle.truncate(17 * 1024 * 1024)  # over the copy limit: linked
    (workdir / "ckpts").mkdir()
    (workdir / "ckpts" / "checkpoint.pt").write_bytes(b"mine")
    (workdir / "ckpts" / "other.txt").write_bytes(b"kept")
    for target in ("checkpoint.pt", "ckpts/checkpoint.pt"):
        from dp2ddp.verify import VerifyOptions, verify

        report = verify(VerifyOptions(script=str(SCRIPT), args=["--save-to", target], timeout=30.0))
        assert report.ok, [c.to_dict() for c in report.checks if c.status == "fail"]
        assert f"{target} (rank 0)" in by_name(report)["single-writer"].message
    # appending to a file in a linked folder: a scratch copy of it gets the lines
    (workdir / "ckpts" / "train.log").write_text("old\n")
    report = verify(VerifyOptions(script=str(SCRIPT), args=["--append-log", "ckpts/train.log"], timeout=30.0))
    assert report.ok, [c.to_dict() for c in report.checks if c.status == "fail"]
    assert ".dp2ddp-" not in by_name(report)["single-writer"].message  # (the harness's own copy)
    assert (workdir / "ckpts" / "train.log").read_text() == "old\n"
    # a script that enters a linked folder first: its writes there stay in the scratch too
    report = verify(VerifyOptions(script=str(SCRIPT), args=["--chdir", "ckpts"], timeout=30.0))
    assert report.ok, [c.to_dict() for c in report.checks if c.status == "fail"]
    assert big.stat().st_size == 17 * 1024 * 1024
    assert (workdir / "ckpts" / "checkpoint.pt").read_bytes() == b"mine"
    assert sorted(os.listdir(workdir / "ckpts")) == ["checkpoint.pt", "other.txt", "train.log"]


def test_private_copy_keeps_a_linked_file_that_is_appended_to(tmp_path):
    from dp2ddp.verify.harness import private_copy

    user, scratch = tmp_path / "user", tmp_path / "scratch"
    (user / "logs").mkdir(parents=True)
    (user / "logs" / "train.log").write_text("old\n")
    scratch.mkdir()
    os.symlink(user / "logs", scratch / "logs")
    path = str(scratch / "logs" / "train.log")
    private_copy(path, str(scratch), keep=True)
    with open(path, "a") as handle:
        handle.write("new\n")
    assert (scratch / "logs" / "train.log").read_text() == "old\nnew\n"
    assert (user / "logs" / "train.log").read_text() == "old\n"
    assert not os.path.islink(scratch / "logs") and os.path.islink(scratch / "logs" / "train.log") is False


def test_a_script_that_never_trains_is_not_verified(workdir):
    from dp2ddp.verify import VerifyOptions, text, verify

    script = workdir / "only_init.py"
    script.write_text(
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "dist.destroy_process_group()\n"
    )
    report = verify(VerifyOptions(script=str(script), nproc_per_node=2, timeout=30.0, launcher="fork"))
    statuses = {c.name: c.status for c in report.checks}
    assert statuses["process-group"] == "pass"
    assert statuses["ddp-wrapped"] == statuses["in-sync"] == "inconclusive"
    assert not report.ok
    assert "NOT VERIFIED" in text(report)


@pytest.mark.parametrize(
    "fault, check, words",
    [
        ("no-init", "process-group", "never called init_process_group"),
        ("not-wrapped", "ddp-wrapped", "0 of them in a DistributedDataParallel model"),
        ("unsharded", "data-sharded", "every rank iterates the whole dataset"),
        ("no-set-epoch", "set-epoch", "same order"),
        ("diverge", "in-sync", "hold different parameters"),
        ("diverge-early", "in-sync", "after the first step, rank(s) [1] hold different parameters"),
        ("every-rank-saves", "single-writer", "checkpoint.pt is written by ranks [0, 1]"),
        ("leave-early", "no-crash", "rank 1 left the training loop early"),
    ],
)
def test_fault_fails_its_check(workdir, fault, check, words):
    report = run(fault)
    result = by_name(report)[check]
    assert not report.ok
    assert result.status == "fail", result.to_dict()
    assert words in result.message
    assert result.advice
    if check != "in-sync":
        assert result.location and "train.py:" in result.location


def test_hang_is_stopped_within_the_timeout_with_stacks(workdir):
    started = time.time()
    report = run("hang", timeout=6.0)
    elapsed = time.time() - started
    checks = by_name(report)
    hang = checks["no-hang"]
    assert hang.status == "fail" and "6 s" in hang.message, hang.to_dict()
    # stopped by the timeout, not by the script ending (the hang never ends): a
    # bound to catch a verify that waits on, not a speed target (benchmarks/)
    assert elapsed < 6.0 + 60
    assert "train.py:" in (hang.location or "")
    stacks = hang.details["stacks"]
    assert set(stacks) == {"0", "1"} and all("File" in s for s in stacks.values())
    # the checks the hang cut short say so: not "raise --max-steps", not "finished"
    stopped = "the run was stopped at its time budget (no progress for --timeout 6 s) while rank 0 (at "
    epoch, crash = checks["set-epoch"], checks["no-crash"]
    assert epoch.status == "inconclusive" and stopped in epoch.message, epoch.to_dict()
    assert "--max-steps" not in epoch.message and "ran one epoch" not in epoch.message
    assert crash.status == "inconclusive" and stopped in crash.message, crash.to_dict()
    assert re.search(r"rank 0 \(at \S*train\.py:\d+\), rank 1 \(at \S*train\.py:\d+\) were blocked \(check 7\)",
                     crash.message), crash.message
    assert "finished" not in crash.message and "budget" not in crash.message.replace("time budget", "")


def test_a_rank_that_leaves_with_os_exit_is_named(workdir):
    """``os._exit(0)`` on rank 1 after 3 steps: no traceback, exit status 0 -- the
    rank is named, with where it left, not rank 0's broken collective."""
    from dp2ddp.verify import text

    report = run("exit-early")
    crash = by_name(report)["no-crash"]
    assert not report.ok and crash.status == "fail", text(report)
    assert crash.rank == 1
    assert "rank 1 left with os._exit(0) after 3 step(s), before the end of training" in crash.message
    assert "rank(s) [0] then failed in a collective" in crash.message, crash.message
    assert crash.location and "train.py:" in crash.location
    assert "os._exit" in crash.advice
    # the pass rank 1 was in when it left is recorded: the shard check still judges
    assert by_name(report)["data-sharded"].status == "pass", text(report)


def test_os_exit_on_every_rank_after_the_same_steps_is_the_scripts_way_to_end():
    from types import SimpleNamespace

    from dp2ddp.verify.checks import Records, check_no_crash

    def exited(steps, t):
        return [{"event": "start"}, {"event": "exit", "status": 0, "steps": steps, "t": t, "where": "t.py:9"}]

    launched = SimpleNamespace(stalled=False, crashed=False, exit_codes={})
    same = check_no_crash(Records(ranks={0: exited(8, 1.0), 1: exited(8, 1.1)}, stacks={}, logs={}), launched)
    assert same.status == "pass" and "through os._exit(0)" in same.message, same.to_dict()
    early = check_no_crash(Records(ranks={0: exited(8, 2.0), 1: exited(3, 1.0)}, stacks={}, logs={}), launched)
    assert early.status == "fail" and early.rank == 1 and "went on training without it" in early.message


def test_a_child_in_a_session_of_its_own_does_not_outlive_the_run(workdir):
    """Rank 0 starts a sleeping child with ``start_new_session=True`` (out of the
    rank's process group, and its rank exits before the run ends): verify stops
    it, and says so."""
    from dp2ddp.verify import VerifyOptions, text, verify

    pidfile = workdir / "daemon.pid"
    report = verify(VerifyOptions(script=str(SCRIPT), args=["--spawn-daemon", str(pidfile)], timeout=30.0))
    assert report.ok, text(report)
    pid = int(pidfile.read_text())
    # it was still running when the ranks were done (what it would have gone on doing)
    assert any(f"pid {pid}: " in n and "verify stopped them" in n for n in report.notes), report.notes
    deadline = time.time() + 5
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), f"the script's child {pid} is still running"


def test_in_sync_does_not_pass_a_script_that_was_not_converted(workdir):
    """A DataParallel script run under verify unconverted: every process trains
    alone, on the same data from the same seed -- identical parameters that
    nothing kept identical are not a pass."""
    from dp2ddp.verify import VerifyOptions, text, verify

    script = FIXTURES / "e2e" / "dp_classifier" / "before" / "train.py"
    report = verify(VerifyOptions(script=str(script), args=["--epochs", "2"], timeout=30.0))
    checks = by_name(report)
    assert checks["process-group"].status == "fail", text(report)
    sync = checks["in-sync"]
    assert sync.status == "inconclusive", text(report)
    assert "nothing keeps them so: rank(s) [0, 1] train no DistributedDataParallel model" in sync.message


def test_in_sync_on_recorded_steps():
    from dp2ddp.verify.checks import Records, check_in_sync

    def step(h, wrapped=3):
        return [{"event": "init"}, {"event": "first_step", "params": 3, "wrapped": wrapped, "checksum": {"hash": h, "sum": 0.0}}]

    def records(*ranks):
        return Records(ranks=dict(enumerate(ranks)), stacks={}, logs={})

    assert check_in_sync(records(step("a"), step("a"))).status == "pass"
    assert check_in_sync(records(step("a"), step("b"))).status == "fail"
    # not wrapped: identical by computing the same, not kept so; different is still a fault
    assert check_in_sync(records(step("a", 0), step("a", 0))).status == "inconclusive"
    assert check_in_sync(records(step("a", 0), step("b", 0))).status == "fail"
    no_group = [e for e in step("a") if e["event"] != "init"]
    assert check_in_sync(records(no_group, no_group)).status == "inconclusive"
    assert check_in_sync(records(step("a"))).status == "skip"  # a world of one: nothing to compare


def test_the_harness_holds_the_process_group_a_script_drops(tmp_path):
    """Dropped by the script (destroy_process_group, then the DDP model freed as
    main() returns), a Gloo group's last reference can be the model's Reducer:
    pybind frees it holding the GIL, ~ProcessGroupGloo joins its worker threads,
    and a worker still freeing the last all-reduce's work waits for the GIL -- the
    rank sat at the main() line until check 7 failed (py-spy's native stacks; 1
    run in 15 of three verifies at once on 2 cores).  The harness holds every
    group until the rank leaves (os._exit: never destroyed).  Checked in a
    process of its own (the hooks patch torch)."""
    code = (
        "import gc, sys\n"
        "import torch, torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel\n"
        "from dp2ddp.verify.harness import Harness\n"
        "harness = Harness(sys.argv[1])\n"
        "harness.install()\n"
        "dist.init_process_group('gloo', init_method='file://' + sys.argv[2], rank=0, world_size=1)\n"
        "model = DistributedDataParallel(torch.nn.Linear(2, 1))\n"
        "group = model.process_group\n"
        "dist.destroy_process_group()\n"
        "del model\n"
        "gc.collect()\n"
        "print('held', any(g is group for g in harness.keep))\n"
    )
    env = {**os.environ, "DP2DDP_VERIFY_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    env.pop("RANK", None)
    proc = subprocess.run([sys.executable, "-c", code, str(SCRIPT), str(tmp_path / "store")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "held True" in proc.stdout, proc.stdout + proc.stderr


def test_crash_is_reported_with_rank_and_traceback(workdir):
    report = run("crash")
    crash = by_name(report)["no-crash"]
    assert crash.status == "fail"
    assert crash.rank == 1
    assert "simulated" in crash.details["traceback"] and "rank 1 crashed" in crash.message
    assert "train.py:" in crash.location


def test_two_simulated_machines_expose_local_rank_assumptions(workdir):
    one = run("local-rank-saves")
    assert by_name(one)["single-writer"].status == "pass"
    two = run("local-rank-saves", nnodes=2)
    assert two.world_size == 4 and two.launcher == "torchrun"
    writer = by_name(two)["single-writer"]
    assert writer.status == "fail" and "ranks [0, 2]" in writer.message
    assert by_name(two)["process-group"].status == "pass"


def test_against_the_original(workdir):
    case = FIXTURES / "e2e" / "dp_classifier"
    # shuffled, so that the original's RandomSampler must be fed the distributed run's
    # order (it draws its own otherwise: not the same samples)
    original = (case / "before" / "train.py").read_text()
    converted = (case / "after" / "train.py").read_text()
    shuffled = "DataLoader(train_set, batch_size=args.batch_size, shuffle=True)"
    (workdir / "original.py").write_text(
        original.replace("DataLoader(train_set, batch_size=args.batch_size, shuffle=False)", shuffled)
    )
    (workdir / "converted.py").write_text(converted.replace("DistributedSampler(train_set, shuffle=False)", "DistributedSampler(train_set, shuffle=True)"))
    assert (workdir / "original.py").read_text() != original and (workdir / "converted.py").read_text() != converted
    from dp2ddp.verify import VerifyOptions, verify

    good = verify(VerifyOptions(script="converted.py", args=["--epochs", "2"], against="original.py"))
    match = by_name(good)["matches-original"]
    assert match.status == "pass", match.to_dict()
    assert match.details["max_difference"] < 1e-4
    # a conversion that forgot to divide the batch trains a different model
    text = (workdir / "converted.py").read_text()
    (workdir / "wrong.py").write_text(
        text.replace("batch_size=per_rank_batch_size(args.batch_size)", "batch_size=args.batch_size")
    )
    bad = verify(VerifyOptions(script="wrong.py", args=["--epochs", "2"], against="original.py"))
    mismatch = by_name(bad)["matches-original"]
    assert mismatch.status == "fail" and mismatch.details["max_difference"] > 1e-4


def test_device_check_flags_global_rank_as_device():
    from dp2ddp.verify.checks import Records, check_devices

    records = Records(
        ranks={
            0: [{"event": "start", "local_rank": 0}, {"event": "set_device", "index": 0}],
            2: [{"event": "start", "local_rank": 0}, {"event": "set_device", "index": 2, "where": "t.py:9"}],
        },
        stacks={},
        logs={},
    )
    result = check_devices(records)
    assert result.status == "fail" and result.rank == 2 and "global rank" in result.message


def test_cli_json_and_exit_codes(workdir):
    cmd = [sys.executable, "-m", "dp2ddp", "verify", "--format", "json", str(SCRIPT), "--", "--epochs", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    assert data["ok"] and data["world_size"] == 2
    assert [c["id"] for c in data["checks"]] == list(range(1, 10))
    text_cmd = [sys.executable, "-m", "dp2ddp", "verify", str(SCRIPT), "--", "--fault", "unsharded"]
    bad = subprocess.run(text_cmd, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "✗ 3." in bad.stdout
    usage = subprocess.run([sys.executable, "-m", "dp2ddp", "verify", "missing.py"], capture_output=True, text=True)
    assert usage.returncode == 2


def test_convert_then_verify(workdir):
    case = FIXTURES / "e2e" / "single_gpu" / "before" / "train.py"
    shutil.copy(case, workdir / "train.py")
    cmd = [sys.executable, "-m", "dp2ddp", "convert", "--write", "--verify", "train.py"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=workdir)
    assert proc.returncode == 0, proc.stderr
    assert "dp2ddp verify train.py" in proc.stderr and "OK: the script runs distributed." in proc.stderr
    assert "DistributedDataParallel(" in (workdir / "train.py").read_text()
    usage = subprocess.run(cmd[:4] + ["--verify", "train.py"], capture_output=True, text=True, cwd=workdir)
    assert usage.returncode == 2 and "--write" in usage.stderr


def test_a_script_that_exits_on_its_arguments_shows_its_output(workdir):
    from dp2ddp.verify import VerifyOptions, text, verify

    script = workdir / "needs_args.py"
    script.write_text(
        "import argparse\n"
        "import torch.distributed as dist\n"
        "parser = argparse.ArgumentParser()\n"
        "parser.add_argument('--lr', type=float, required=True)\n"
        "parser.parse_args()\n"
        "dist.init_process_group('gloo')\n"
    )
    report = verify(VerifyOptions(script=str(script), nproc_per_node=2, timeout=30.0, launcher="fork"))
    checks = by_name(report)
    assert checks["process-group"].status == "fail"
    assert "exited before init_process_group" in checks["process-group"].message
    assert checks["no-crash"].status == "fail" and "SystemExit(2)" in checks["no-crash"].message
    assert "the following arguments are required: --lr" in text(report)


def test_a_package_entry_point_with_relative_imports_runs_as_a_module(workdir):
    """``pkg/train.py`` imports ``from .data import ...``: it only runs as ``python -m
    pkg.train`` (convert's launch line says so), and verify runs it that way."""
    from dp2ddp.verify import VerifyOptions, verify

    package = workdir / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "data.py").write_text(
        "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
        "from torch.utils.data.distributed import DistributedSampler\n\n\ndef make_loader():\n"
        "    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))\n"
        "    return DataLoader(data, batch_size=4, sampler=DistributedSampler(data, shuffle=True))\n"
    )
    (package / "train.py").write_text(
        "import torch\nimport torch.distributed as dist\n"
        "from torch.nn.parallel import DistributedDataParallel\n\nfrom .data import make_loader\n\n\n"
        "def main():\n    dist.init_process_group('gloo')\n"
        "    model = DistributedDataParallel(torch.nn.Linear(4, 1))\n"
        "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    loader = make_loader()\n"
        "    for epoch in range(2):\n        loader.sampler.set_epoch(epoch)\n        for x, y in loader:\n"
        "            opt.zero_grad()\n            torch.nn.functional.mse_loss(model(x), y).backward()\n"
        "            opt.step()\n    dist.destroy_process_group()\n\n\n"
        "if __name__ == '__main__':\n    main()\n"
    )
    report = verify(VerifyOptions(script="pkg/train.py"))
    crashed = by_name(report)["no-crash"]
    assert crashed.status == "pass", crashed.to_dict()
    assert report.ok, [c.to_dict() for c in report.checks if c.status == "fail"]


def test_sigterm_stops_the_ranks_and_removes_the_run_folder(tmp_path):
    """``timeout``, a CI cancel or ``kill`` send SIGTERM: the ranks (each in its own
    session) must not outlive the coordinator, nor its scratch folder."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dp2ddp", "verify", "--max-steps", "1000000", "--epoch-batches", "1000000",
         str(SCRIPT), "--", "--epochs", "1000000"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    pids = []
    deadline = time.time() + 60
    while len(pids) < 2 and time.time() < deadline:
        pids = []
        for record in temp.glob("dp2ddp-verify-*/rank*.jsonl"):
            lines = record.read_text().splitlines()
            if lines:
                pids.append(json.loads(lines[0])["pid"])
        time.sleep(0.2)
    assert len(pids) == 2, proc.communicate(timeout=30)[0]
    time.sleep(1.0)
    proc.send_signal(15)
    output = proc.communicate(timeout=30)[0].decode()
    assert proc.returncode == 130, output
    assert "interrupted" in output
    deadline = time.time() + 5
    while any(_alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.05)
    assert not [p for p in pids if _alive(p)]
    assert list(temp.glob("dp2ddp-verify-*")) == []


def test_a_script_that_exits_0_before_the_process_group_says_so(workdir):
    script = workdir / "quits.py"
    script.write_text('print("nothing to do: give a config")\nraise SystemExit(0)\n')
    from dp2ddp.verify import VerifyOptions, verify

    report = verify(VerifyOptions(script=str(script), timeout=30.0))
    check = by_name(report)["process-group"]
    assert not report.ok and check.status == "fail"
    assert "ended (exit status 0) before init_process_group" in check.message
    assert "nothing to do: give a config" in str(check.details.get("output")), check.to_dict()


def test_a_run_stopped_by_the_budget_says_the_code_after_the_loop_did_not_run(workdir):
    from dp2ddp.verify import VerifyOptions, verify

    stopped = verify(VerifyOptions(script=str(SCRIPT), args=["--epochs", "50"], max_steps=8, timeout=30.0))
    assert stopped.ok
    assert any("code after it" in n and "was not run" in n for n in stopped.notes), stopped.notes
    finished = run(max_steps=100000)
    assert finished.ok and not any("code after it" in n for n in finished.notes), finished.notes


def test_a_shard_made_by_hand_with_subset_passes_and_a_shared_one_fails(workdir, monkeypatch):
    from dp2ddp.verify import VerifyOptions, verify

    script = str(FIXTURES / "verify" / "subset_shard.py")
    report = verify(VerifyOptions(script=script, timeout=30.0))
    check = by_name(report)["data-sharded"]
    assert check.status == "pass" and "2 disjoint shards of 256 samples" in check.message, check.to_dict()
    monkeypatch.setenv("SHARD", "0")  # every rank the same Subset
    report = verify(VerifyOptions(script=script, timeout=30.0))
    assert by_name(report)["data-sharded"].status == "fail"
    monkeypatch.setenv("SHARD", "uneven")  # disjoint, but the ranks take different numbers of steps
    report = verify(VerifyOptions(script=script, timeout=30.0))
    assert "of different sizes (96, 160 samples, 12, 20 batches)" in by_name(report)["data-sharded"].message


def test_a_sampler_of_the_projects_own_is_judged_by_the_orders_it_drew(workdir):
    from dp2ddp.verify import VerifyOptions, text, verify
    from dp2ddp.verify.checks import Records, check_set_epoch

    report = verify(VerifyOptions(script=str(FIXTURES / "verify" / "custom_sampler.py"), timeout=30.0))
    checks = by_name(report)
    assert report.ok, text(report)
    assert checks["set-epoch"].message.startswith("ShardShuffleSampler (the project's own): 3 epochs, each in a new order")
    assert checks["data-sharded"].message.startswith("ranks drew disjoint samples (custom sampler")

    def passes(shuffle, orders):
        return Records(
            ranks={0: [
                {"event": "pass", "start_step": 0, "end_step": 2, "sampler": "Bucket", "shuffle": shuffle,
                 "indices": order}
                for order in orders
            ]},
            stacks={}, logs={},
        )

    # a batch sampler of the project's own (a BatchSampler subclass that never set .sampler)
    # is judged by what it drew, not as the DataLoader's default SequentialSampler
    unsharded = verify(
        VerifyOptions(script=str(FIXTURES / "verify" / "custom_sampler.py"), args=["--unsharded-batches"], timeout=30.0)
    )
    checks = by_name(unsharded)
    assert checks["data-sharded"].status == "fail", text(unsharded)
    assert "make ShuffledBatches give each rank its own part" in checks["data-sharded"].advice
    assert checks["set-epoch"].message.startswith("ShuffledBatches (the project's own): 3 epochs, each in a new order")

    # the same order every epoch: not a failure (it may not shuffle), but said
    same = check_set_epoch(passes(None, [[3, 1, 2], [3, 1, 2]]))
    assert same.status == "pass" and "gave the same order in the first 3 samples of 2 epochs" in same.message
    # a sampler known not to shuffle needs no new order; one known to shuffle (a DistributedSampler
    # with shuffle=True) drawing the same order is the forgotten set_epoch
    assert check_set_epoch(passes(False, [[1, 2, 3], [1, 2, 3]])).message.startswith("the training sampler does not")
    assert check_set_epoch(passes(True, [[3, 1, 2], [3, 1, 2]])).status == "fail"


def test_a_split_drawn_on_each_rank_fails_the_shard_check(workdir):
    """Forked ranks start from the coordinator's random state; they are reseeded
    like processes torchrun starts, so an unseeded random_split differs by rank."""
    from dp2ddp.verify import VerifyOptions, verify

    report = verify(VerifyOptions(script=str(FIXTURES / "verify" / "random_split.py"), timeout=30.0))
    check = by_name(report)["data-sharded"]
    assert check.status == "fail" and "each rank has a different Subset of the same size" in check.message
    assert "generator=torch.Generator().manual_seed(0)" in check.advice


@pytest.mark.parametrize(
    "shards, subsets, words",
    [
        ([[0, 2, 4, 6], [1, 3, 5, 7]], [list(range(0, 16, 2)), list(range(1, 16, 2))], "sharded twice"),
        ([list(range(8)), list(range(8))], [None, None], "every rank draws all 8 samples"),
        ([[0, 1, 2, 3], [3, 4, 5, 6]], [None, None], "ranks draw 1 sample more than once (padding explains 0)"),
        ([[0, 1, 2], [3, 4, 5]], [None, None], "2 of 8 samples are never drawn"),
        ([[0, 2, 4, 6], [1, 3, 5, 7]], [None, None], None),
    ],
)
def test_shard_check_on_recorded_passes(shards, subsets, words):
    from dp2ddp.verify.checks import Records, check_sharded

    def event(shard, subset):
        record = {"event": "pass", "start_step": 0, "end_step": 2, "dataset_len": 8, "shard": shard,
                  "drop_last": False, "where": "train.py:9"}
        if subset is not None:
            record["subset"] = subset
        return record

    records = Records(ranks={r: [event(s, sub)] for r, (s, sub) in enumerate(zip(shards, subsets))}, stacks={}, logs={})
    check = check_sharded(records)
    if words is None:
        assert check.status == "pass" and check.message == "2 disjoint shards covering 8 of 8 samples"
    else:
        assert check.status == "fail" and words in check.message, check.to_dict()


# ---------------------------------------------------------------- real loaders (issue 20)
WORKERS = FIXTURES / "verify" / "loader_workers.py"


@pytest.mark.parametrize(
    "args, check, status, words",
    [
        ([], "data-sharded", "pass", "2 disjoint shards covering 128 of 128 samples"),
        (["--fault", "no-sampler"], "data-sharded", "fail", "every rank iterates the whole dataset (128 samples"),
        (["--fault", "no-set-epoch"], "set-epoch", "fail", "all 3 epochs draw the samples in the same order"),
        (["--fault", "no-set-epoch", "--prefetcher"], "set-epoch", "fail", "all 3 epochs draw the samples in the same order"),
    ],
    ids=["correct", "no-sampler", "no-set-epoch", "no-set-epoch-prefetcher"],
)
def test_loader_workers_prefetching_a_whole_epoch(workdir, args, check, status, words):
    """num_workers=2, pin_memory, persistent_workers; 4 batches an epoch, all drawn
    (prefetched) before the epoch's first step: the sampler's indices are observed in
    the rank's process, the pass is judged by the steps taken while it is consumed."""
    from dp2ddp.verify import VerifyOptions, text, verify

    report = verify(VerifyOptions(script=str(WORKERS), args=args, launcher="torchrun", timeout=60.0))
    result = by_name(report)[check]
    assert result.status == status and words in result.message, text(report)
    if status == "pass":
        assert report.ok, text(report)
        assert by_name(report)["set-epoch"].message.startswith("3 epochs, each in a new order"), text(report)
    else:
        others = [c.name for c in report.checks if c.status != "pass" and c.name not in (check, "local-device")]
        assert others == [], text(report)


def test_a_batch_sampler_of_the_projects_own_with_workers(workdir):
    from dp2ddp.verify import VerifyOptions, text, verify

    report = verify(VerifyOptions(script=str(WORKERS), args=["--batch-sampler"], timeout=60.0))
    assert report.ok, text(report)
    assert by_name(report)["data-sharded"].message.startswith("ranks drew disjoint samples (custom sampler")


@pytest.mark.parametrize(
    "stream, status, words",
    [
        ("sharded", "pass", "ranks received disjoint samples (an iterable dataset; compared by content, rank 0: 64"),
        ("same", "fail", "ranks receive the same samples (an iterable dataset): 80 of the 80 distinct samples"),
        ("opaque", "inconclusive", "cannot be told (an iterable dataset)"),
    ],
)
def test_an_iterable_dataset_gets_a_true_shard_verdict(workdir, stream, status, words):
    from dp2ddp.verify import VerifyOptions, text, verify

    script = FIXTURES / "verify" / "iterable_data.py"
    report = verify(VerifyOptions(script=str(script), args=["--stream", stream], timeout=60.0))
    result = by_name(report)["data-sharded"]
    assert result.status == status and words in result.message, text(report)


def test_a_sampler_of_unreadable_indices_is_judged_by_content_not_passed():
    """Indices that are not integers (nothing to intersect) never make 'disjoint'."""
    from dp2ddp.verify.checks import Records, check_sharded

    def ranks(prints):
        return Records(ranks={r: [{"event": "pass", "start_step": 0, "end_step": 2, "sampler": "KeySampler",
                                   "shuffle": None, "indices": [], "samples": [[None, fp] for fp in fps]}]
                              for r, fps in enumerate(prints)}, stacks={}, logs={})

    assert check_sharded(ranks([["a", "b"], ["a", "b"]])).status == "fail"
    assert check_sharded(ranks([["a", "b"], ["c", "d"]])).status == "pass"
    assert check_sharded(ranks([[], []])).status == "inconclusive"
    assert check_sharded(ranks([list("abcdefgh"), list("aijklmno")])).status == "inconclusive"


def test_against_with_data_drawn_in_each_process_is_inconclusive_not_failed(workdir):
    """The dataset draws torch.rand in each process: the original's run and the ranks
    hold different samples for the same index, so the weights cannot match -- said,
    not blamed on the conversion; seeded, the same script matches the original."""
    from dp2ddp.verify import VerifyOptions, text, verify

    script = str(FIXTURES / "verify" / "random_dataset.py")
    unseeded = verify(VerifyOptions(script=script, against=script, timeout=60.0))
    match = by_name(unseeded)["matches-original"]
    assert match.status == "inconclusive", text(unseeded)
    assert "the data is not deterministic across processes" in match.message
    assert "not the same in rank 0 and the original's run" in match.message
    assert "RandomPoints (defined at " in match.message and "random_dataset.py:" in match.message
    seeded = verify(VerifyOptions(script=script, args=["--seeded"], against=script, timeout=60.0))
    match = by_name(seeded)["matches-original"]
    assert match.status == "pass" and match.details["max_difference"] < 1e-4, text(seeded)


def test_data_disagreement_across_ranks_on_the_same_index():
    from dp2ddp.verify.checks import data_disagreement

    same = {"rank 0": {"samples": [[0, "a"], [1, "b"]]}, "rank 1": {"samples": [[1, "b"], [2, "c"]]}}
    assert data_disagreement(same) is None
    differ = {"rank 0": {"samples": [[0, "a"], [1, "b"]]},
              "rank 1": {"samples": [[1, "x"]], "dataset": "Noise", "dataset_defined": "data.py:3"}}
    message = data_disagreement(differ)
    assert "sample 1 of the training set is not the same in rank 0 and rank 1" in message
    assert "Noise (defined at data.py:3)" in message


@pytest.mark.parametrize(
    "start, uses, status",
    [
        # device 1 on LOCAL_RANK 1: right
        ({"local_rank": 1}, [{"event": "set_device", "index": 1}], "pass"),
        # each rank narrows CUDA_VISIBLE_DEVICES to its own GPU, then uses device 0: right
        ({"local_rank": 1}, [{"event": "set_device", "index": 0, "visible": "1"}], "pass"),
        # the user launched on GPUs 2,3: LOCAL_RANK 1 is GPU 3, device index 1
        ({"local_rank": 1, "visible": "2,3"}, [{"event": "set_device", "index": 1, "visible": "2,3"}], "pass"),
        ({"local_rank": 1, "visible": "2,3"}, [{"event": "set_device", "index": 0, "visible": "2,3"}], "fail"),
        # no set_device, but the DDP model sits on GPU 0 on LOCAL_RANK 1
        ({"local_rank": 1}, [{"event": "ddp", "cuda_device": 0}], "fail"),
        ({"local_rank": 0}, [{"event": "ddp", "cuda_device": None}], "skip"),
    ],
)
def test_device_check_reads_indices_through_cuda_visible_devices(start, uses, status):
    from dp2ddp.verify.checks import Records, check_devices

    records = Records(ranks={1: [{"event": "start", **start}, *uses]}, stacks={}, logs={})
    assert check_devices(records).status == status, check_devices(records).to_dict()


def test_set_device_index_forms():
    import torch

    from dp2ddp.verify.harness import _device_index

    assert [_device_index(d) for d in (1, "cuda:1", torch.device("cuda", 1), "cuda")] == [1, 1, 1, None]


def test_gpu_check_skips_cleanly_without_cuda(tmp_path):
    """No GPU here: the script says so and exits 0 before installing anything."""
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.sh"
    env = {**os.environ, "GPU_CHECK_VENV": str(tmp_path / "venv")}
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0 and "skipped: no CUDA" in proc.stdout, proc.stdout + proc.stderr
    assert not (tmp_path / "venv").exists()


def test_the_amp_fixture_verifies_on_cpu(workdir):
    from dp2ddp.verify import VerifyOptions, text, verify

    report = verify(VerifyOptions(script=str(FIXTURES / "verify" / "amp_train.py"), timeout=60.0))
    assert report.ok, text(report)
