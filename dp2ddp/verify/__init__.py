"""``dp2ddp verify``: run a (converted) script under DDP for a step budget and
check, at run time, that it really is distributed.

The coordinator starts the ranks (``launch``), each running the script under the
``harness``; it watches for progress, tears the run down on a crash or a stall,
and turns the per-rank records into the checks of ``checks``.  With
``against=ORIGINAL`` it also runs the original single-process script for the
same number of samples and compares the final weights.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from dp2ddp.verify.checks import Check, Records, data_disagreement, evaluate, first_training_pass, read_events


@dataclass
class VerifyOptions:
    script: str
    args: List[str] = field(default_factory=list)
    nproc_per_node: int = 2
    nnodes: int = 1
    max_steps: int = 20
    epoch_batches: int = 0  # 0: max_steps // 4
    timeout: float = 120.0
    against: Optional[str] = None
    tolerance: float = 1e-4
    launcher: str = "auto"  # auto | fork | torchrun
    keep: bool = False
    deterministic: bool = False
    #: where the ranks run; None: a scratch folder that mirrors the current one
    #: (see ``sandbox``), so that the run's checkpoints never land on -- or resume
    #: from -- the user's own
    workdir: Optional[str] = None


#: files of the current folder up to this size are copied into the scratch
#: folder (writing them touches the copy); larger ones and folders are linked
COPY_LIMIT = 16 * 1024 * 1024


def sandbox(target: str, source: str) -> str:
    """A scratch working folder for a run: every entry of ``source`` appears in it,
    small files as copies, folders and large files as symbolic links, so relative
    paths to data and configs still resolve while new files (checkpoints,
    snapshots, logs) stay in the scratch folder."""
    os.makedirs(target)
    budget = 16 * COPY_LIMIT
    for entry in sorted(os.scandir(source), key=lambda e: e.name):
        if entry.name in (".git",) or os.path.abspath(entry.path) == os.path.dirname(os.path.abspath(target)):
            continue
        link = os.path.join(target, entry.name)
        try:
            size = entry.stat().st_size if entry.is_file() else None
            if size is not None and size <= min(COPY_LIMIT, budget):
                shutil.copy2(entry.path, link)
                budget -= size
            else:
                os.symlink(os.path.abspath(entry.path), link)
        except OSError:
            continue  # unreadable: the script could not use it either
    return target


@dataclass
class VerifyReport:
    script: str
    world_size: int
    nnodes: int
    checks: List[Check]
    duration: float
    run_dir: Optional[str]
    launcher: str
    notes: List[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every check passed (or does not apply): a check that could not run
        because the script never trained is not a pass."""
        return all(c.status in ("pass", "skip") for c in self.checks)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "script": self.script,
            "ok": self.ok,
            "world_size": self.world_size,
            "nnodes": self.nnodes,
            "launcher": self.launcher,
            "duration_s": round(self.duration, 2),
            "run_dir": self.run_dir,
            "checks": [c.to_dict() for c in self.checks],
            "notes": self.notes,
        }


def default_nproc() -> int:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.device_count()
    except ImportError:  # pragma: no cover
        pass
    return 2


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        return False


def verify(options: VerifyOptions) -> VerifyReport:
    from dp2ddp.verify import launch

    if not options.epoch_batches:
        options.epoch_batches = max(1, options.max_steps // 4)
    if options.against:
        options.deterministic = True
    run_dir = tempfile.mkdtemp(prefix="dp2ddp-verify-")
    shown = options.script
    options.script = os.path.abspath(options.script)
    if options.against:
        options.against = os.path.abspath(options.against)
    cwd = options.workdir or sandbox(os.path.join(run_dir, "work"), os.getcwd())
    started = time.time()
    launcher = options.launcher
    if launcher == "auto":
        # CUDA does not survive a fork of a process that has asked it about its
        # devices: on a GPU machine the ranks are started by torchrun (exec'd)
        forked_ok = hasattr(os, "fork") and not _cuda_available()
        launcher = "torchrun" if options.nnodes > 1 or not forked_ok else "fork"
    world = options.nproc_per_node * options.nnodes
    try:
        launched = launch.Launched(family=launch.Descendants(run_dir))
        try:
            with launch.terminate_as_interrupt():
                if launcher == "fork":
                    launch.fork_ranks(run_dir, options, cwd, launched)
                else:
                    launch.torchrun_nodes(run_dir, options, cwd, launched)
                launched = launch.watch(run_dir, launched, options, started)
        except BaseException:  # Ctrl-C, SIGTERM: no rank outlives the coordinator
            launch.stop(launched, run_dir)
            raise
        records = Records.load(run_dir)
        checks = evaluate(records, world, launched, options)
        notes = sorted({e["text"] for events in records.ranks.values() for e in events if e.get("event") == "note"})
        ends = [records.first(rank, "end") or {} for rank in records.ranks]
        if ends and all(end.get("reason") == "budget" for end in ends):
            notes.append(
                f"the step budget ({options.max_steps} steps) stopped every rank in the training loop: the "
                "code after it (a final save, a last barrier, the clean-up) was not run -- give the script "
                "a short run (fewer epochs, through its arguments after `--`) and a larger --max-steps "
                "to check it too"
            )
        rank_passes = {f"rank {rank}": first_training_pass(events) for rank, events in sorted(records.ranks.items())}
        across_ranks = data_disagreement(rank_passes)
        if across_ranks:
            notes.append(across_ranks)
        if launched.escaped:
            notes.append(
                f"the script started {len(launched.escaped)} process(es) outside its ranks' process groups "
                f"(a session of their own), still running when the ranks were done: verify stopped them "
                f"({'; '.join(launched.escaped)})"
            )
        if options.against:
            try:
                checks.append(_against(options, run_dir, rank_passes))
            finally:  # what the original started outlives it no more than the ranks' do
                leftovers = launch.Descendants(run_dir)
                leftovers.scan((), environ=True)
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    leftovers.signal(sig)
    finally:
        if not options.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
    options.script = shown
    return VerifyReport(
        script=shown,
        world_size=world,
        nnodes=options.nnodes,
        checks=checks,
        duration=time.time() - started,
        run_dir=run_dir if options.keep else None,
        launcher=launcher,
        notes=notes,
    )


def _against(options: VerifyOptions, run_dir: str, rank_passes: Dict[str, Any]) -> Check:
    """Run the original single-process for the same samples; compare final weights."""
    from dp2ddp.verify import harness as H

    check = Check(10, "matches-original", f"final weights match {os.path.relpath(options.against)}")
    env = dict(os.environ)
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    env.update(
        {
            H.ENV_DIR: run_dir,
            H.ENV_MAX_STEPS: str(options.max_steps),
            H.ENV_EPOCH_BATCHES: str(options.epoch_batches),
            H.ENV_TIMEOUT: str(options.timeout),
            H.ENV_MODE: "original",
            H.ENV_DETERMINISTIC: "1",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        }
    )
    log_path = os.path.join(run_dir, "original.log")
    with open(log_path, "wb") as log:
        try:
            cwd = options.workdir or sandbox(os.path.join(run_dir, "work-original"), os.getcwd())
            proc = subprocess.run(
                [sys.executable, "-m", "dp2ddp.verify.harness", options.against, *options.args],
                env=env,
                cwd=cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=max(60.0, options.timeout * 3),
            )
        except subprocess.TimeoutExpired:
            return check.fail("the original did not finish in time", advice="raise --timeout")
    if proc.returncode != 0:
        with open(log_path, errors="replace") as handle:
            tail = handle.read()[-2000:]
        return check.fail(
            f"the original exited with status {proc.returncode}",
            advice="the original must run on this machine as a single process",
            log=tail,
        )
    # the same samples? (a dataset drawn at random in each process is not: the weights cannot match)
    original_pass = first_training_pass(read_events(os.path.join(run_dir, "original.jsonl")))
    differ = data_disagreement({**rank_passes, "the original's run": original_pass})
    if differ:
        return check.inconclusive(differ + ": the final weights cannot be compared")
    distributed = os.path.join(run_dir, "params-rank0.pt")
    original = os.path.join(run_dir, "params-original.pt")
    if not (os.path.exists(distributed) and os.path.exists(original)):
        return check.inconclusive("no optimizer step in one of the runs: nothing to compare")
    import torch

    a = torch.load(distributed, map_location="cpu")
    b = torch.load(original, map_location="cpu")
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        return check.fail(
            f"the two runs train different parameters ({len(a)} vs {len(b)} tensors)",
            advice="compare a conversion with its own original",
        )
    worst = max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b)) if a else 0.0
    if worst > options.tolerance and _unreplayed_shuffle(run_dir):
        return check.inconclusive(
            f"max weight difference {worst:.3g}, but the original drew its own shuffled samples "
            "(its loader could not be fed the distributed run's order: several shuffled loaders, "
            "or a batch size the processes do not divide): not the same samples"
        )
    if worst > options.tolerance:
        return check.fail(
            f"max weight difference {worst:.3g} > {options.tolerance:g} after the same samples",
            advice="the conversion changed the training math: check the per-process batch size "
            "(global batch / world size), the loss reduction, shuffling and dropout",
            max_difference=worst,
        )
    return check.ok(f"max weight difference {worst:.3g} (tolerance {options.tolerance:g})", max_difference=worst)


def _unreplayed_shuffle(run_dir: str) -> bool:
    """The original's run had a shuffled pass that was not replayed from the
    distributed run's sample order."""
    import json

    try:
        with open(os.path.join(run_dir, "original.jsonl")) as handle:
            events = [json.loads(line) for line in handle if line.strip()]
    except (OSError, ValueError):
        return False
    return any(e.get("event") == "pass" and e.get("shuffle") and not e.get("replayed") for e in events)


# ------------------------------------------------------------------ output
def text(report: VerifyReport) -> str:
    lines = [
        f"dp2ddp verify {report.script}: {report.world_size} processes"
        + (f" on {report.nnodes} simulated machines" if report.nnodes > 1 else "")
        + f" ({report.launcher}), {report.duration:.1f} s"
    ]
    for check in report.checks:
        mark = {"pass": "✓", "fail": "✗", "skip": "-", "inconclusive": "?"}[check.status]
        lines.append(f"  {mark} {check.id}. {check.title}: {check.message}")
        if check.status == "fail":
            if check.location:
                lines.append(f"      at {check.location}" + (f" (rank {check.rank})" if check.rank is not None else ""))
            if check.advice:
                lines.append(f"      what to do: {check.advice}")
            if check.details.get("output"):
                lines.append("      the script's output:")
                lines += ["        " + ln for ln in check.details["output"].splitlines()]
            elif "traceback" in check.details:
                lines += ["      " + ln for ln in check.details["traceback"].rstrip().splitlines()[-12:]]
            for rank, stack in sorted(check.details.get("stacks", {}).items()):
                lines.append(f"      rank {rank} stack:")
                lines += ["        " + ln for ln in stack.splitlines()[:25]]
    for note in report.notes:
        lines.append(f"  note: {note}")
    failed = sum(1 for c in report.checks if c.status == "fail")
    unknown = sum(1 for c in report.checks if c.status == "inconclusive")
    if report.ok:
        lines.append("OK: the script runs distributed.")
    elif failed:
        lines.append(f"FAILED: {failed} check(s)." + (f" {unknown} could not run." if unknown else ""))
    else:
        undecided = ", ".join(str(c.id) for c in report.checks if c.status == "inconclusive")
        lines.append(f"NOT VERIFIED: {unknown} check(s) could not decide ({undecided}: see why above).")
    if report.run_dir:
        lines.append(f"records and logs kept in {report.run_dir}")
    return "\n".join(lines) + "\n"


def to_json(report: VerifyReport) -> str:
    return json.dumps(report.to_dict(), indent=2) + "\n"
