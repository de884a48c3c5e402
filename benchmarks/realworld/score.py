"""Real-repository harness: convert, adapt, run original and converted, judge.

    python benchmarks/realworld/score.py --src /work/rw/src --work /work/rw/score [--only NAME,...]

--src holds one exported snapshot per repository, named as "snapshot" in
repos.json (owner+name); nothing is fetched here.  Per repository: copy the
snapshot to WORK/NAME/{orig,conv}, run `dp2ddp convert --write --allow-dirty` on
conv, apply adapters/NAME.py to both trees (identical edits), run the original
with python and the converted one with torchrun (2 processes, Gloo), read the
probe files (probe.py) and judge.  One line per repository, then the score line.
"""
import argparse
import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
VENV = Path(sys.executable).parent


def run(cmd, cwd, env, timeout, log):
    with open(log, "w") as out:
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        finally:
            try:  # leftovers of this run only: its own process group
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    return rc


def load(d):
    out = {}
    for f in Path(d).glob("rank*.json"):
        r = json.loads(f.read_text())
        out[r["rank"]] = r
    return out


CKPT_CHECK = r"""
import sys, torch
sys.path[:0] = sys.argv[2:]
try:
    torch.load(sys.argv[1], map_location="cpu", weights_only=False)
except Exception as e:
    print(type(e).__name__, str(e)[:200])
    sys.exit(1)
"""


def checkpoint_problems(conv, tree, rundir):
    """A checkpoint of the converted run must load in a plain process (no process
    group): a pickled DDP wrapper does not."""
    bad = []
    paths = sorted({p for r in conv.values() for p in r["saves"] if os.path.isfile(p)})
    for p in paths:
        r = subprocess.run([sys.executable, "-c", CKPT_CHECK, p, str(tree / rundir), str(tree)],
                           cwd=tree / rundir, capture_output=True, text=True, timeout=120)
        if r.returncode:
            bad.append(f"{os.path.relpath(p, tree)} does not load without a process group: "
                       f"{r.stdout.strip()[:120]}")
    return bad


def judge(orig, conv, world):
    """Problems found in the converted run (empty list: correct)."""
    bad = []
    if 0 not in orig:
        return ["original run left no probe file"]
    if sorted(conv) != list(range(world)):
        return [f"probe files for ranks {sorted(conv)}, expected {list(range(world))}"]
    # parameters equal across ranks after the last step
    o0 = conv[0]["optimizers"]
    for r in range(1, world):
        orr = conv[r]["optimizers"]
        if len(orr) != len(o0):
            bad.append(f"rank {r} built {len(orr)} optimizers, rank 0 {len(o0)}")
            continue
        for k, (a, b) in enumerate(zip(o0, orr)):
            if a["steps"] != b["steps"]:
                bad.append(f"optimizer {k}: {a['steps']} steps on rank 0, {b['steps']} on rank {r}")
            tol = 1e-6 * max(1.0, a["abs"])
            if abs(a["sum"] - b["sum"]) > tol or abs(a["abs"] - b["abs"]) > tol:
                bad.append(f"optimizer {k}: parameters differ across ranks after the last step "
                           f"(sum {a['sum']:.6g} vs {b['sum']:.6g})")
    if not o0 and orig[0]["optimizers"]:
        bad.append("converted run built no optimizer")
    if o0 and all(o["steps"] == 0 for o in o0) and any(o["steps"] for o in orig[0]["optimizers"]):
        bad.append("converted run never stepped an optimizer")
    # training passes: disjoint across ranks, reshuffled between epochs when the original was
    def train_passes(rec):
        by = {}
        for p in rec["passes"]:
            if p["backward"] > 0:
                by.setdefault(p["loader"], []).append(p)
        return by
    otr = train_passes(orig[0])
    ctr = [train_passes(conv[r]) for r in range(world)]
    for lid, opasses in otr.items():
        shuffled = len(opasses) > 1 and opasses[0]["idx"] != opasses[1]["idx"]
        cps = [c.get(lid, []) for c in ctr]
        if not all(cps):
            bad.append(f"training loader {lid}: some rank never trained on it")
            continue
        for e in range(min(len(c) for c in cps)):
            sets = [set(c[e]["idx"]) for c in cps]
            n = cps[0][e]["n"]
            inter = set.intersection(*sets)
            # DistributedSampler pads with up to world-1 repeats when n % world != 0
            if len(inter) > (world - 1 if n % world else 0):
                bad.append(f"training loader {lid} pass {e}: ranks share {len(inter)} of "
                           f"{len(sets[0])} indices (every rank trains on the same data)")
                break
        if shuffled:
            for r, c in enumerate(cps):
                if len(c) > 1 and c[0]["idx"] == c[1]["idx"]:
                    bad.append(f"training loader {lid}: rank {r} sees the same order every epoch "
                               f"(the original reshuffled)")
                    break
    # one writer per checkpoint path
    writers = {}
    for r in range(world):
        for path in set(conv[r]["saves"]):
            writers.setdefault(path, set()).add(r)
    for path, rs in sorted(writers.items()):
        if len(rs) > 1:
            bad.append(f"{os.path.basename(path)} saved by ranks {sorted(rs)}")
    owriters = {}
    for r in range(world):
        for path in conv[r].get("writes", []):
            owriters.setdefault(path, set()).add(r)
    for path, rs in sorted(owriters.items()):
        if len(rs) > 1 and path not in writers:
            bad.append(f"{os.path.basename(path)} opened for writing by ranks {sorted(rs)}")
    return bad


#: a file convert names in its report: a spot left, an error, a file not converted
_REPORTED = re.compile(r"^\s*(?:error: |internal error: )?([^\s:]+\.py):\d+(?::\d+)?", re.M)


def lint_disagreements(conv, target, convert_stderr, env):
    """The error-severity findings of `dp2ddp lint` on the converted tree in files that
    convert's report does not name (a spot left, an error, a file it could not convert):
    where lint and convert's summary disagree ("path:line CODE")."""
    reported = set(_REPORTED.findall(convert_stderr))
    lint = subprocess.run([sys.executable, "-m", "dp2ddp", "lint", "--format", "json", target],
                          cwd=conv, capture_output=True, text=True, timeout=600, env=env)
    try:
        findings = json.loads(lint.stdout or "[]")
    except json.JSONDecodeError:
        return [f"lint gave no JSON (rc={lint.returncode})"]
    return [f"{f['path']}:{f['line']} {f['code']}" for f in findings
            if f.get("severity") == "error" and f["path"] not in reported]


def one(entry, src, work, timeout, world, tool=None):
    name = entry["name"]
    d = work / name
    if d.exists():
        shutil.rmtree(d)
    snap = src / entry["snapshot"] / entry.get("subdir", "")
    for t in ("orig", "conv"):
        shutil.copytree(snap, d / t, symlinks=True)
    target = entry.get("convert", ".")
    cenv = dict(os.environ)
    if tool:  # a pinned copy of dp2ddp (git archive of a commit), ahead of the editable install
        cenv["PYTHONPATH"] = f"{tool}/shim:{tool}/pkg"
    cv = subprocess.run([sys.executable, "-m", "dp2ddp", "convert", "--write", "--allow-dirty",
                         target], cwd=d / "conv", capture_output=True, text=True, timeout=600,
                        env=cenv)
    (d / "convert.log").write_text(cv.stdout + "\n--- stderr\n" + cv.stderr)
    m = re.search(r"(\d+) spots? left for you", cv.stderr)
    spots = int(m.group(1)) if m else 0
    info = {"name": name, "convert_rc": cv.returncode, "spots": spots,
            "incomplete": "could not be converted" in cv.stderr or cv.returncode == 1
            or "so it was not converted" in cv.stderr}
    info["lint_disagrees"] = lint_disagreements(d / "conv", target, cv.stderr, cenv)
    adapter = importlib.import_module("adapters." + entry.get("adapter", name.replace("-", "_")))
    for t in ("orig", "conv"):
        adapter.adapt(d / t)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0", **entry.get("env", {}))
    env.pop("RANK", None), env.pop("WORLD_SIZE", None), env.pop("LOCAL_RANK", None)
    rundir = entry.get("cwd", ".")
    phases = entry.get("args", [])
    if not phases or not isinstance(phases[0], list):
        phases = [phases]  # one run; a list of lists: runs one after another (resume)
    rel_entry = os.path.relpath(entry["entry"], rundir)
    info["orig_rc"], info["conv_rc"], why = [], [], []
    for k, args in enumerate(phases):
        pr = {t: d / f"probe_{t}{k}" for t in ("orig", "conv")}
        for p in pr.values():
            if p.exists():
                shutil.rmtree(p)
        e = dict(env, RW_PROBE_DIR=str(pr["orig"]))
        orc = run([sys.executable, rel_entry, *args], d / "orig" / rundir, e, timeout,
                  d / f"orig{k}.log")
        e = dict(env, RW_PROBE_DIR=str(pr["conv"]))
        crc = run([str(VENV / "torchrun"), "--standalone", f"--nproc_per_node={world}",
                   rel_entry, *args], d / "conv" / rundir, e, timeout, d / f"conv{k}.log")
        info["orig_rc"].append(orc)
        info["conv_rc"].append(crc)
        tag = f"run {k + 1}: " if len(phases) > 1 else ""
        if orc != 0:
            info["verdict"], info["why"] = "harness-error", [f"{tag}original exited {orc}"]
            return info
        if crc != 0:
            why.append(f"{tag}converted run exited {crc}")
            break
        conv_rec = load(pr["conv"])
        why += [tag + w for w in judge(load(pr["orig"]), conv_rec, world)]
        why += [tag + w for w in checkpoint_problems(conv_rec, d / "conv", rundir)]
    info["why"] = why
    if not why:
        info["verdict"] = "correct"
    elif (info["incomplete"] or spots) and entry.get("spots_explain_failure", True):
        info["verdict"] = "reported-incomplete"
    else:
        info["verdict"] = "silently-wrong"
    return info


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True, type=Path, help="folder of exported snapshots")
    ap.add_argument("--work", required=True, type=Path, help="scratch folder (outside the project)")
    ap.add_argument("--only", default="", help="comma-separated names")
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--tool", type=Path, default=None,
                    help="run the frozen copy of dp2ddp that pin_tool.py made there")
    a = ap.parse_args()
    repos = json.loads((HERE / "repos.json").read_text())
    only = set(filter(None, a.only.split(",")))
    a.work.mkdir(parents=True, exist_ok=True)
    results = []
    if a.tool:
        print(f"dp2ddp at {(a.tool / 'COMMIT').read_text().strip()[:12]} (frozen copy {a.tool})")
    for entry in repos:
        if only and entry["name"] not in only:
            continue
        info = one(entry, a.src.resolve(), a.work.resolve(), a.timeout, a.nproc,
                   a.tool.resolve() if a.tool else None)
        results.append(info)
        spot = f" ({info['spots']} spots reported)" if info["spots"] else ""
        print(f"{info['name']:<28} {info['verdict']:<20} convert rc={info['convert_rc']}{spot}; "
              f"orig rc={','.join(map(str, info['orig_rc']))} conv rc={','.join(map(str, info['conv_rc']))}"
              + ("; " + "; ".join(info["why"]) if info["why"] else "")
              + (f"; lint errors convert did not report: {', '.join(info['lint_disagrees'])}"
                 if info.get("lint_disagrees") else ""), flush=True)
    (a.work / "results.json").write_text(json.dumps(results, indent=1))
    m = len(results)
    c = sum(r["verdict"] == "correct" for r in results)
    k = sum(r["verdict"] == "reported-incomplete" for r in results)
    s = sum(r["verdict"] == "silently-wrong" for r in results)
    h = m - c - k - s
    print(f"{c}/{m} converted correctly, {k} reported incomplete, {s} silently wrong"
          + (f" ({h} harness errors)" if h else ""))
    disagree = [r["name"] for r in results if r.get("lint_disagrees")]
    print(f"lint on the converted code agrees with convert's report on {m - len(disagree)}/{m}"
          + (f" (not on {', '.join(disagree)})" if disagree else ""))


if __name__ == "__main__":
    main()
