"""Precision of `dp2ddp lint` on real DDP repositories, and recall on small buggy scripts.

Precision: lints the chosen paths of every repository in ``lint_set.json`` (snapshots
under ``--src``, one folder per repository named ``owner+name``, exported at the
commit given), joins the findings with ``lint_labels.csv`` by (repo, path, line,
code) and prints, per rule and overall, TRUE / (TRUE + FALSE); DEBATABLE findings
are counted apart. Also the false ERROR-severity findings, the findings with no
label (to be labelled), and the labels that match no finding any more (a false
alarm fixed, or a true finding lost).

Recall: every ``lint_recall/*.py`` (and every ``lint_recall/<case>/`` folder, linted
as one program) carries ``# expect: DDPxxx:LINE[, DDPyyy:LINE]`` header comments;
an expectation is met when lint reports that code at that line of that file.

    .venv/bin/python benchmarks/realworld/lint_precision.py --src /work/rw/lintsrc
    .venv/bin/python benchmarks/realworld/lint_precision.py --src /work/rw/lintsrc --select ALL
    .venv/bin/python benchmarks/realworld/lint_precision.py --src /work/rw/lintsrc --dump new.csv
    .venv/bin/python benchmarks/realworld/lint_precision.py --src /work/rw/lintsrc \
        --write-figures codemods/rules/lint_set_figures.json

No repository code is kept in the project: the labels name paths and lines only.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
LABELS = ("TRUE", "FALSE", "DEBATABLE")
EXPECT = re.compile(r"#\s*expect:\s*(.+)")
ITEM = re.compile(r"(DDP\d{3}):(\d+)")


def lint(cwd: Path, paths, args) -> list:
    cmd = [args.python, "-m", "dp2ddp", "lint", "--no-config", "--no-cache", "--format", "json",
           "--exit-zero", "-q"]
    if args.select:
        cmd += ["--select", args.select]
    if args.ignore:
        cmd += ["--ignore", args.ignore]
    env = dict(os.environ)
    if args.tool:  # a frozen copy of dp2ddp (pin_tool.py), ahead of the editable install
        env["PYTHONPATH"] = f"{args.tool}/shim:{args.tool}/pkg"
    proc = subprocess.run(cmd + list(paths), cwd=cwd, capture_output=True, text=True, env=env)
    if proc.returncode not in (0, 1):
        sys.exit(f"lint failed in {cwd} (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout or "[]")


def load_labels(path: Path) -> dict:
    labels = {}
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            if row["label"] not in LABELS:
                sys.exit(f"{path}: bad label {row['label']!r} in {row}")
            labels[(row["repo"], row["path"], int(row["line"]), row["code"])] = row
    return labels


def pct(num: int, den: int) -> str:
    return f"{100.0 * num / den:5.1f}%" if den else "   - "


def precision(args) -> None:
    spec = json.loads((HERE / "lint_set.json").read_text())
    labels = load_labels(Path(args.labels))
    only = set(args.only.split(",")) if args.only else None
    findings = []  # (repo, commit, finding)
    for entry in spec["repos"]:
        if only and entry["repo"] not in only:
            continue
        root = Path(args.src) / entry["snapshot"]
        if not root.is_dir():
            sys.exit(f"missing snapshot {root}: export {entry['repo']} at {entry['commit']}")
        for finding in lint(root, entry["paths"], args):
            findings.append((entry["repo"], entry["commit"], finding))

    per_rule = defaultdict(Counter)
    severity = {}
    unlabelled, false_errors, seen = [], [], set()
    for repo, commit, f in findings:
        key = (repo, f["path"], f["line"], f["code"])
        severity[f["code"]] = f["severity"]
        row = labels.get(key)
        if row is None:
            per_rule[f["code"]]["UNLABELLED"] += 1
            unlabelled.append((repo, commit, f))
            continue
        seen.add(key)
        per_rule[f["code"]][row["label"]] += 1
        if row["label"] == "FALSE" and f["severity"] == "error":
            false_errors.append((key, row["reason"]))

    linted = [e["repo"] for e in spec["repos"] if not only or e["repo"] in only]
    print(f"dp2ddp lint precision on {len(linted)} repositories "
          f"({len({r for r, _, _ in findings})} with findings), "
          f"{len(findings)} findings (select: {args.select or 'default'})")
    print(f"{'code':8} {'severity':8} {'found':>5} {'TRUE':>5} {'FALSE':>5} {'DEBAT':>5} "
          f"{'unlab':>5}  precision")
    total = Counter()
    for code in sorted(per_rule):
        c = per_rule[code]
        total.update(c)
        found = sum(c.values())
        print(f"{code:8} {severity[code]:8} {found:5} {c['TRUE']:5} {c['FALSE']:5} "
              f"{c['DEBATABLE']:5} {c['UNLABELLED']:5}  {pct(c['TRUE'], c['TRUE'] + c['FALSE'])}")
    found = sum(total.values())
    print(f"{'overall':17} {found:5} {total['TRUE']:5} {total['FALSE']:5} {total['DEBATABLE']:5} "
          f"{total['UNLABELLED']:5}  {pct(total['TRUE'], total['TRUE'] + total['FALSE'])}")

    print(f"\nfalse errors: {len(false_errors)}")
    for (repo, path, line, code), reason in false_errors:
        print(f"  {repo} {path}:{line} {code}  -- {reason}")

    print(f"\nunlabelled findings: {len(unlabelled)}")
    for repo, commit, f in unlabelled[: args.max_list]:
        print(f"  {repo} {f['path']}:{f['line']} {f['code']} {f['severity']}: {f['message']}")
    if len(unlabelled) > args.max_list:
        print(f"  ... {len(unlabelled) - args.max_list} more (--dump FILE writes them all)")

    gone = Counter()
    gone_true = []
    for key, row in labels.items():
        if key in seen or key[0] not in set(linted):
            continue
        if args.select and not any(key[3].startswith(s) for s in args.select.split(",") if s != "ALL") \
                and "ALL" not in args.select.split(","):
            continue
        gone[row["label"]] += 1
        if row["label"] == "TRUE":
            gone_true.append(key)
    if gone:
        print(f"\nlabelled findings no longer reported: {dict(gone)} "
              "(FALSE: an alarm fixed; TRUE: a real finding lost)")
        for repo, path, line, code in gone_true:
            print(f"  lost TRUE: {repo} {path}:{line} {code}")

    if args.write_figures:
        write_figures(Path(args.write_figures), spec, linted, per_rule, severity, false_errors)

    if args.dump:
        with open(args.dump, "w", newline="") as handle:
            w = csv.writer(handle)
            w.writerow(["repo", "commit", "path", "line", "code", "label", "reason", "severity", "message"])
            for repo, commit, f in unlabelled:
                w.writerow([repo, commit, f["path"], f["line"], f["code"], "", "", f["severity"], f["message"]])
        print(f"\nwrote {len(unlabelled)} unlabelled findings to {args.dump}")


def write_figures(path: Path, spec: dict, linted, per_rule, severity, false_errors) -> None:
    """The per-rule figures that `dp2ddp rule` and docs/rules.md give as each rule's
    reason to be in the default set (``Rule.DEFAULT``); also checks that policy."""
    import importlib

    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=HERE, capture_output=True,
                            text=True).stdout.strip()
    figures = {
        "about": "lint_precision.py --write-figures: findings of every rule (--select ALL) on the lint set "
                 "(lint_set.json), by the labels of lint_labels.csv",
        "measured_at": commit,
        "repositories": sorted(linted),
        "rules": {
            code: {"found": sum(c.values()), "true": c["TRUE"], "false": c["FALSE"],
                   "debatable": c["DEBATABLE"], "unlabelled": c["UNLABELLED"],
                   "false_errors": sum(1 for key, _ in false_errors if key[3] == code)}
            for code, c in sorted(per_rule.items())
        },
    }
    path.write_text(json.dumps(figures, indent=1) + "\n")
    print(f"\nwrote the per-rule figures to {path}")
    rules = importlib.import_module("dp2ddp.codemods.rules")
    for rule in rules.RULES:
        earned = rules.default_earned(figures["rules"].get(rule.CODE))
        if earned != rule.DEFAULT:
            print(f"  {rule.CODE}: DEFAULT = {rule.DEFAULT}, but its figures say {'on' if earned else 'off'} "
                  f"(precision floor {rules.DEFAULT_PRECISION:.0%} once {rules.DEFAULT_MIN_JUDGED} findings are "
                  "judged, no false error)")


def recall(args) -> None:
    base = HERE / "lint_recall"
    cases = sorted(p for p in base.iterdir() if p.suffix == ".py" or p.is_dir())
    met = missed = 0
    misses = []
    for case in cases:
        files = [case] if case.is_file() else sorted(case.rglob("*.py"))
        cwd = case.parent if case.is_file() else case
        expected = []
        for file in files:
            rel = file.relative_to(cwd).as_posix()
            for text in file.read_text().splitlines():
                m = EXPECT.match(text.strip())
                if m:
                    expected += [(rel, int(line), code) for code, line in ITEM.findall(m.group(1))]
        if not expected:
            sys.exit(f"{case}: no '# expect: DDPxxx:LINE' header")
        got = {(f["path"], f["line"], f["code"]) for f in
               lint(cwd, [file.relative_to(cwd).as_posix() for file in files], args)}
        for item in expected:
            if item in got:
                met += 1
            else:
                missed += 1
                near = sorted(f"{c}:{l}" for p, l, c in got if p == item[0])
                misses.append((case.name, item, near))
    print(f"\nrecall on {len(cases)} buggy scripts: {met}/{met + missed} expectations met "
          f"({pct(met, met + missed).strip()})")
    for name, (path, line, code), near in misses:
        print(f"  missed {code}:{line} in {name}"
              + (f" ({path})" if path != name else "")
              + f"; lint reported: {', '.join(near) or 'nothing'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default="/work/rw/lintsrc", help="folder of the snapshots (owner+name)")
    ap.add_argument("--labels", default=str(HERE / "lint_labels.csv"))
    ap.add_argument("--select", default="", help="passed to lint --select (ALL: every rule); "
                    "default: lint's default rules")
    ap.add_argument("--ignore", default="", help="passed to lint --ignore")
    ap.add_argument("--only", default="", help="comma-separated repositories (owner/name)")
    ap.add_argument("--python", default=sys.executable, help="interpreter with dp2ddp installed")
    ap.add_argument("--tool", default="", help="folder made by pin_tool.py: lint with that frozen "
                    "copy of dp2ddp (the working tree may be mid-edit)")
    ap.add_argument("--dump", default="", help="write the unlabelled findings to this CSV")
    ap.add_argument("--max-list", type=int, default=50, help="unlabelled findings to list")
    ap.add_argument("--write-figures", default="", metavar="JSON",
                    help="write the per-rule figures (codemods/rules/lint_set_figures.json: the "
                    "default-set reasons `dp2ddp rule` shows) and check each rule's DEFAULT against them")
    ap.add_argument("--no-recall", action="store_true")
    ap.add_argument("--recall-only", action="store_true")
    args = ap.parse_args()
    if args.write_figures and not args.select:
        args.select = "ALL"  # (the rules off by default are measured too: they may earn their place)
    if args.tool:
        print(f"dp2ddp at {(Path(args.tool) / 'COMMIT').read_text().strip()[:12]} (frozen copy {args.tool})")
    if not args.recall_only:
        precision(args)
    if not args.no_recall:
        recall(args)


if __name__ == "__main__":
    main()
