"""Speed of dp2ddp at repository scale, against a parse floor, TorchFix and ruff.

    python benchmarks/lint_speed.py [--corpus torch|generated|PATH ...] [--repeat 3]
                                    [--torchfix PATH] [--ruff PATH] [--copies 100]

Corpora that exist on every machine without network: the installed torch
package's own sources, and a generated repository of N copies of the e2e
fixtures.  For each it prints files, lines and the median wall time of:

* floors: reading every file; LibCST ``parse_module`` of every file (one process
  and all cores), and a parse plus one scope analysis (what a LibCST codemod that
  resolves names through metadata pays before it changes anything: the bound of
  any LibCST-based ``convert``); ``ast.parse`` of every file;
* ``dp2ddp lint`` with a cold and a warm cache; ``dp2ddp convert --check``;
* TorchFix (``torchfix``, a benchmark-only dependency: ``pip install torchfix``,
  best in its own virtual environment, passed with ``--torchfix``) as the
  closest LibCST-based peer, and ``ruff check --select ALL`` as the native ceiling;
* the start-up time of ``dp2ddp --version`` and of ``dp2ddp lint`` on one small file;

and the ratios dp2ddp / TorchFix and dp2ddp / parse floor.  Tools that are not
installed are reported as such.  Not part of the test-suite.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Callable, Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
DP2DDP = [sys.executable, "-m", "dp2ddp"]


def torch_sources() -> Path:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torch is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def generated(copies: int, into: Path) -> Path:
    cases = sorted((ROOT / "fixtures" / "e2e").glob("*/before"))
    for index in range(copies):
        for case in cases:
            target = into / f"project{index:04d}" / case.parent.name
            shutil.copytree(case, target)
    return into


def py_files(root: Path) -> List[Path]:
    return sorted(p for p in root.rglob("*.py") if p.is_file())


def timed(function: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# An installed package has its bytecode compiled (pip does it at install time);
# with PYTHONDONTWRITEBYTECODE set (as on some CI images) every run of a
# checkout would compile dp2ddp's modules again and time that instead.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def run(cmd: List[str], cwd: Optional[Path] = None) -> None:
    subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)


def _parse_libcst(path: str) -> None:
    import libcst

    try:
        libcst.parse_module(Path(path).read_bytes())
    except Exception:
        pass


def _parse_and_scope(path: str) -> None:
    """What any LibCST codemod that resolves names through metadata pays per file
    before it changes anything: a parse and one scope analysis."""
    import libcst
    from libcst.metadata import MetadataWrapper, ScopeProvider

    try:
        MetadataWrapper(libcst.parse_module(Path(path).read_bytes()), unsafe_skip_copy=True).resolve(ScopeProvider)
    except Exception:
        pass


def _parse_ast(path: str) -> None:
    try:
        ast.parse(Path(path).read_bytes())
    except Exception:
        pass


def floors(root: Path, files: List[Path], repeat: int) -> Dict[str, float]:
    names = [str(p) for p in files]
    out = {
        "read every file": timed(lambda: [p.read_bytes() for p in files], repeat),
        "ast.parse every file (1 process)": timed(lambda: [_parse_ast(n) for n in names], repeat),
    }
    # what a command-line tool cannot do faster: start Python, find the files, read them
    finder = (
        "import os,sys\n"
        "for d, dirs, files in os.walk(sys.argv[1]):\n"
        "    dirs[:] = [x for x in dirs if not x.startswith('.')]\n"
        "    for f in files:\n"
        "        if f.endswith('.py'):\n"
        "            open(os.path.join(d, f), 'rb').read()\n"
    )
    out["a process that finds and reads every file"] = timed(
        lambda: run([sys.executable, "-c", finder, str(root)]), repeat
    )
    out["LibCST parse every file (1 process)"] = timed(lambda: [_parse_libcst(n) for n in names], 1)
    workers = os.cpu_count() or 1
    with ProcessPoolExecutor(workers) as pool:
        out[f"LibCST parse every file ({workers} processes)"] = timed(
            lambda: list(pool.map(_parse_libcst, names, chunksize=16)), 1
        )
        out[f"LibCST parse + scopes of every file ({workers} processes)"] = timed(
            lambda: list(pool.map(_parse_and_scope, names, chunksize=16)), 1
        )
    return out


def measure(
    corpus: Path, repeat: int, torchfix: Optional[str], ruff: Optional[str], slow_repeat: int, convert: bool = True
) -> None:
    files = py_files(corpus)
    lines = sum(p.read_bytes().count(b"\n") for p in files)
    print(f"\n{corpus}: {len(files)} files, {lines} lines")
    results: Dict[str, float] = floors(corpus, files, repeat)

    cache_root = Path(tempfile.mkdtemp(prefix="dp2ddp-bench-"))
    try:
        def cold():
            shutil.rmtree(cache_root / ".dp2ddp_cache", ignore_errors=True)
            run(DP2DDP + ["lint", "--no-config", "--exit-zero", "-q", str(corpus)], cwd=cache_root)

        results["dp2ddp lint (cold cache)"] = timed(cold, repeat)
        for fmt in ("json", "sarif"):  # what CI runs: as fast as text (no fix is run)
            results[f"dp2ddp lint --format {fmt} (no cache)"] = timed(
                lambda: run(DP2DDP + ["lint", "--no-config", "--exit-zero", "--no-cache", "--format", fmt, str(corpus)]),
                repeat,
            )
        results["dp2ddp lint --format text (no cache)"] = timed(
            lambda: run(DP2DDP + ["lint", "--no-config", "--exit-zero", "--no-cache", str(corpus)]), repeat
        )
        run(DP2DDP + ["lint", "--no-config", "--exit-zero", "-q", str(corpus)], cwd=cache_root)
        results["dp2ddp lint (warm cache)"] = timed(
            lambda: run(DP2DDP + ["lint", "--no-config", "--exit-zero", "-q", str(corpus)], cwd=cache_root),
            repeat,
        )
        if convert:
            # cold: no cache (what the TorchFix target is about); warm: the same
            # check again on unchanged files (CI, or --write after a look at the diff)
            results["dp2ddp convert --check"] = timed(
                lambda: run(DP2DDP + ["convert", "--check", "-q", "--no-cache", str(corpus)]), slow_repeat
            )
            run(DP2DDP + ["convert", "--check", "-q", str(corpus)], cwd=cache_root)
            results["dp2ddp convert --check (warm cache)"] = timed(
                lambda: run(DP2DDP + ["convert", "--check", "-q", str(corpus)], cwd=cache_root), repeat
            )
    finally:
        shutil.rmtree(cache_root, ignore_errors=True)
    if torchfix:
        results["TorchFix"] = timed(lambda: run([torchfix, str(corpus)]), slow_repeat)
    if ruff:
        results["ruff check --select ALL"] = timed(
            lambda: run([ruff, "check", "--select", "ALL", "--no-cache", "--exit-zero", "-q", str(corpus)]), repeat
        )
    for name, seconds in results.items():
        print(f"  {name:<44} {seconds:9.3f} s")
    lint = results["dp2ddp lint (cold cache)"]
    floor = results["read every file"]
    warm = results["dp2ddp lint (warm cache)"]
    print(f"  {'warm lint / reading the files':<44} {warm / floor:9.2f} x")
    print(f"  {'warm lint / a process finding+reading them':<44} {warm / results['a process that finds and reads every file']:9.2f} x")
    if "TorchFix" in results:
        print(f"  {'speed-up of lint over TorchFix':<44} {results['TorchFix'] / lint:9.1f} x")
        scopes = next(v for k, v in results.items() if k.startswith("LibCST parse + scopes"))
        print(f"  {'TorchFix / LibCST parse+scopes floor':<44} {results['TorchFix'] / scopes:9.1f} x")
        if convert:
            print(f"  {'speed-up of convert --check over TorchFix':<44} {results['TorchFix'] / results['dp2ddp convert --check']:9.1f} x")
            print(f"  {'  the same, warm cache':<44} {results['TorchFix'] / results['dp2ddp convert --check (warm cache)']:9.1f} x")
    if "ruff check --select ALL" in results:
        print(f"  {'lint time / ruff time':<44} {lint / results['ruff check --select ALL']:9.2f} x")
    text = results["dp2ddp lint --format text (no cache)"]
    for fmt in ("json", "sarif"):
        print(f"  {f'lint --format {fmt} / text':<44} {results[f'dp2ddp lint --format {fmt} (no cache)'] / text:9.2f} x")
    parse = results["LibCST parse every file (1 process)"]
    print(f"  {'lint time / LibCST parse floor':<44} {lint / parse:9.2f} x")


def startup(repeat: int) -> None:
    small = ROOT / "fixtures" / "rules" / "clean" / "ddp_tutorial.py"
    version = timed(lambda: run(DP2DDP + ["--version"]), repeat)
    lint = timed(lambda: run(DP2DDP + ["lint", "--no-config", "--no-cache", str(small)]), repeat)
    bare = timed(lambda: run([sys.executable, "-c", "pass"]), repeat)
    print("\nstart-up")
    print(f"  {'python -c pass':<44} {bare:9.3f} s")
    print(f"  {'dp2ddp --version':<44} {version:9.3f} s")
    print(f"  {'dp2ddp lint one small file':<44} {lint:9.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", action="append", help="torch, generated or a folder (repeatable)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--slow-repeat", type=int, default=1, help="runs of the slow tools (TorchFix, convert)")
    parser.add_argument("--copies", type=int, default=100, help="copies of the e2e fixtures in 'generated'")
    parser.add_argument("--torchfix", default=shutil.which("torchfix"))
    parser.add_argument("--ruff", default=shutil.which("ruff"))
    parser.add_argument("--no-convert", action="store_true", help="skip convert --check (minutes on 'generated')")
    args = parser.parse_args()
    if not args.torchfix:
        print("TorchFix is not installed: pip install torchfix (or pass --torchfix PATH)")
    if not args.ruff:
        print("ruff is not installed: pip install ruff (or pass --ruff PATH)")
    for command in ("lint", "convert"):  # compiles the bytecode
        run(DP2DDP + [command, "--no-cache", "--no-config" if command == "lint" else "--check", str(ROOT / "fixtures" / "e2e" / "single_gpu")])
    startup(args.repeat)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.corpus or ["generated", "torch"]:
            corpus = (
                torch_sources() if name == "torch"
                else generated(args.copies, Path(tmp) / "generated") if name == "generated"
                else Path(name)
            )
            measure(corpus, args.repeat, args.torchfix, args.ruff, args.slow_repeat, not args.no_convert)


if __name__ == "__main__":
    main()
