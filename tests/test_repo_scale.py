"""Repository scale: migration report, launch files, review mode, lint cache and
parallelism (same findings whichever way they are computed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import FIXTURES, RANK_LOG, copy_tree, script_env, torchrun_cmd
from dp2ddp.cli import cli

MULTI = FIXTURES / "e2e" / "multi_file" / "before"
DP = FIXTURES / "e2e" / "dp_classifier" / "before" / "train.py"


def invoke(*args, input=None):
    return CliRunner().invoke(cli, [str(a) for a in args], input=input, catch_exceptions=False)


@pytest.fixture
def project(tmp_path):
    target = tmp_path / "proj"
    shutil.copytree(MULTI, target)
    (target / "legacy.py").write_text("import torch\nprint 'python 2'\n")
    return target


# ------------------------------------------------------------------ report
def test_markdown_report(project, tmp_path):
    report = tmp_path / "out" / "report.md"
    result = invoke("convert", "--check", "--report", report, project)
    assert result.exit_code == 1
    text = report.read_text()
    for heading in ("# DataParallel → DistributedDataParallel migration report", "## Entry points",
                    "## Batch size and learning rate", "## Launch", "## Left for you",
                    "## Files that could not be converted", "## Changes by file"):
        assert heading in text
    assert f"`{project / 'train.py'}` (the process group is set up here)" in text
    assert "legacy.py" in text and "cannot parse" in text
    assert "| 4 | 3 | 0 | 1 | 0 |" in text  # scanned, changed, unchanged, parse failures, internal
    assert "DDP101 | training DataLoader (train_loader) gets a DistributedSampler" in text
    assert "torchrun --standalone --nproc_per_node=gpu" in text and "--rdzv_backend=c10d" in text


def test_json_report(project, tmp_path):
    report = tmp_path / "report.json"
    invoke("convert", "--report", report, "--report-format", "json", "--batch-size", "per-process", project)
    data = json.loads(report.read_text())
    assert data["summary"]["files_changed"] == 3 and data["summary"]["parse_failures"] == 1
    assert data["entry_points"] == [str(project / "train.py")]
    assert "learning rate" in " ".join(data["batch_size"]["consequences"])
    by_path = {Path(f["path"]).name: f for f in data["files"]}
    assert {c["code"] for c in by_path["model.py"]["changes"]} >= {"DDP001"}
    assert by_path["legacy.py"]["status"] == "error"


def test_report_lists_spots_left_for_a_human(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch\nimport torch.nn as nn\n\n\nclass MyDP(nn.DataParallel):\n    pass\n")
    report = tmp_path / "r.md"
    invoke("convert", "--report", report, script)
    assert "| 5 | DDP001 | class MyDP subclasses DataParallel" in report.read_text()


def test_emitted_launch_files_run_the_converted_script(project, tmp_path):
    launch = tmp_path / "launch"
    result = invoke("convert", "--write", "--emit-launch", launch, project)
    assert result.exit_code == 1  # legacy.py does not parse
    names = sorted(p.name for p in launch.iterdir())
    assert names == ["train.slurm", "train_multinode.sh", "train_torchrun.sh"]
    for path in launch.iterdir():
        assert os.access(path, os.X_OK)
        subprocess.run(["bash", "-n", str(path)], check=True)
    slurm = (launch / "train.slurm").read_text()
    assert "#SBATCH --ntasks-per-node=1" in slurm and "srun torchrun" in slurm
    # sbatch runs a spooled copy: the entry is named by its absolute path
    assert '"${SCRIPT:-$SCRIPT_DEFAULT}"' in slurm and str(project / "train.py") in slurm
    env = script_env(tmp_path)
    env["NPROC_PER_NODE"] = "2"
    env["PATH"] = f"{_torchrun_through_rank_log(tmp_path)}{os.pathsep}{env['PATH']}"
    run = subprocess.run(
        [str(launch / "train_torchrun.sh"), "--epochs", "1"], cwd=project, env=env,
        capture_output=True, text=True, timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert (project / "final.pt").exists()


@pytest.mark.parametrize("nproc", ["4", "gpu", "cpu"])
def test_the_slurm_file_runs_the_processes_per_node_asked_for(tmp_path, nproc):
    from dp2ddp.migration import emit_launch

    (tmp_path / "train.py").write_text("import torch\n")
    written = {p.suffix: p.read_text() for p in emit_launch(tmp_path / "launch", [str(tmp_path / "train.py")], nproc)}
    slurm = written[".slurm"]
    subprocess.run(["bash", "-n", str(tmp_path / "launch" / "train.slurm")], check=True)
    assert f'NPROC_PER_NODE="${{NPROC_PER_NODE:-{nproc}}}"' in written[".sh"]
    if nproc == "4":
        assert "#SBATCH --gpus-per-node=4\n" in slurm and "--nproc_per_node=4 " in slurm
        assert "SLURM_GPUS_ON_NODE" not in slurm and "=8" not in slurm
    elif nproc == "gpu":  # one process per GPU that Slurm allocates
        assert "#SBATCH --gpus-per-node=8\n" in slurm and '--nproc_per_node="${SLURM_GPUS_ON_NODE:-gpu}"' in slurm
    else:  # no GPU asked for on a CPU run
        assert "--gpus-per-node" not in slurm and "--nproc_per_node=cpu " in slurm


def _torchrun_through_rank_log(tmp_path) -> Path:
    """A folder with a ``torchrun`` that runs the script through tests/support/rank_log.py
    (which leaves without the interpreter's teardown: see its docstring)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    shim = folder / "torchrun"
    shim.write_text(
        f"#!{sys.executable}\n"
        "import runpy, sys\n"
        "args = sys.argv[1:]\n"
        "at = next(i for i, a in enumerate(args) if a == '-m' or not a.startswith('-'))\n"
        f"sys.argv = ['torchrun', *args[:at], {str(RANK_LOG)!r}, *args[at:]]\n"
        "runpy.run_module('torch.distributed.run', run_name='__main__')\n"
    )
    shim.chmod(0o755)
    return folder


# ------------------------------------------------------------------ review mode
def _copy_dp(tmp_path):
    path = tmp_path / "train.py"
    shutil.copy(DP, path)
    return path


def test_interactive_accept_all_equals_write(tmp_path):
    path = _copy_dp(tmp_path)
    expected_dir = tmp_path / "expected"
    expected_dir.mkdir()
    shutil.copy(DP, expected_dir / "train.py")
    invoke("convert", "--write", expected_dir / "train.py")
    result = invoke("convert", "--interactive", path, input="a\n")
    assert result.exit_code == 0, result.output
    assert "why: imports used by the converted code" in result.output  # (the first hunk; "a" takes the rest)
    assert path.read_text() == (expected_dir / "train.py").read_text()


def test_interactive_quit_writes_nothing_when_nothing_accepted(tmp_path):
    path = _copy_dp(tmp_path)
    result = invoke("convert", "--interactive", path, input="q\n")
    assert result.exit_code == 0
    assert path.read_text() == DP.read_text()
    assert "0 files written" in result.output


def test_interactive_refuses_an_inconsistent_selection(tmp_path):
    path = _copy_dp(tmp_path)
    # find the hunk that adds the sampler, reject it, accept everything else
    hunks, answers = _inconsistent_answers(path)
    assert "n" in answers and any("DDP102" in h.codes for h in hunks)
    result = invoke("convert", "--interactive", path, input="\n".join(answers) + "\n")
    assert result.exit_code == 1
    assert "inconsistent" in result.output and "DDP102 is kept but DDP101" in result.output
    assert path.read_text() == DP.read_text()


def test_interactive_refuses_a_dangling_name(tmp_path):
    path = _copy_dp(tmp_path)
    from dp2ddp.engine import convert_sources
    from dp2ddp.review import hunks_of

    (file,) = convert_sources({str(path): path.read_bytes()}).files
    hunks = hunks_of(file)
    # reject only the import hunk that defines `dist`
    answers = ["n" if any("import torch.distributed as dist" in line for line in h.new) else "y" for h in hunks]
    result = invoke("convert", "--interactive", path, input="\n".join(answers) + "\n")
    assert result.exit_code == 1 and "`dist` is used but only a rejected change defines it" in result.output


def _inconsistent_answers(path):
    """Answers that reject the sampler and keep its set_epoch: one per hunk."""
    from dp2ddp.engine import convert_sources
    from dp2ddp.review import hunks_of

    (file,) = convert_sources({str(path): path.read_bytes()}).files
    hunks = hunks_of(file)
    return hunks, ["n" if "DDP101" in h.codes else "y" for h in hunks]


def test_interactive_goes_back_keeping_the_answers(tmp_path):
    """An inconsistent selection is not the end: "b" asks every change again with
    the answer given as its default (Enter keeps it); accepting the rejected
    sampler then writes what --write writes."""
    path = _copy_dp(tmp_path)
    expected = tmp_path / "expected" / "train.py"
    expected.parent.mkdir()
    shutil.copy(DP, expected)
    invoke("convert", "--write", expected)
    hunks, answers = _inconsistent_answers(path)
    again = ["y" if a == "n" else "" for a in answers]  # change only the rejected ones
    result = invoke("convert", "--interactive", path, input="\n".join(answers + ["b"] + again) + "\n")
    assert result.exit_code == 0, result.output
    assert "DDP102 is kept but DDP101" in result.output and "(now rejected)?" in result.output
    assert "(now accepted)?" in result.output
    assert path.read_text() == expected.read_text()


def test_interactive_inconsistent_then_write_nothing(tmp_path):
    path = _copy_dp(tmp_path)
    _, answers = _inconsistent_answers(path)
    result = invoke("convert", "--interactive", path, input="\n".join(answers + ["x"]) + "\n")
    assert result.exit_code == 1 and "not written" in result.output
    assert path.read_text() == DP.read_text()


def test_interactive_shows_unchanged_lines_around_each_change(tmp_path):
    from dp2ddp.review import CONTEXT_LINES

    path = _copy_dp(tmp_path)
    hunks, _ = _inconsistent_answers(path)
    source = DP.read_text().splitlines()
    result = invoke("convert", "--interactive", path, input="q\n")
    first = hunks[0]
    shown = result.output.split("accept this change")[0].splitlines()
    before = [" " + line for line in source[max(0, first.start - CONTEXT_LINES) : first.start]]
    after = [" " + line for line in source[first.end : first.end + CONTEXT_LINES]]
    assert before + after, "the first change has no unchanged line around it"
    removed_or_added = [i for i, line in enumerate(shown) if line[:1] in "+-" and not line.startswith("---")]
    assert shown[removed_or_added[0] - len(before) : removed_or_added[0]] == before
    assert shown[removed_or_added[-1] + 1 : removed_or_added[-1] + 1 + len(after)] == after


# ------------------------------------------------------------------ lint cache and -j
@pytest.fixture
def many(tmp_path):
    root = tmp_path / "many"
    sources = sorted((FIXTURES / "rules").rglob("*.py")) + sorted(FIXTURES.glob("e2e/*/*/*.py"))
    for index in range(4):  # enough files for the process pool
        for path in sources:
            target = root / f"copy{index}" / path.parent.name / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, target)
    return root


def test_lint_results_identical_across_jobs_and_cache(many, monkeypatch):
    from dp2ddp.cache import LintCache
    from dp2ddp.config import LintConfig
    from dp2ddp.lint import lint_sources

    sources = {str(p): p.read_bytes() for p in sorted(many.rglob("*.py"))}
    assert len(sources) >= 64
    key = lambda r: [d.to_dict() for d in r.diagnostics]
    serial = lint_sources(sources, LintConfig(), workers=1)
    parallel = lint_sources(sources, LintConfig(), workers=2)
    assert key(serial) == key(parallel) and serial.diagnostics
    cache = LintCache(many, LintConfig())
    cold = lint_sources(sources, LintConfig(), cache=cache)
    cache.save()
    warm_cache = LintCache(many, LintConfig())
    warm = lint_sources(sources, LintConfig(), cache=warm_cache)
    assert key(cold) == key(serial) == key(warm)
    assert cold.parsed > 0 and warm.parsed == 0  # nothing analysed again
    # a changed file is analysed again
    changed = next(p for p in sources if p.endswith("bad_every_rank.py"))
    sources[changed] = sources[changed] + b"\n# edited\n"
    again = lint_sources(sources, LintConfig(), cache=LintCache(many, LintConfig()))
    assert again.parsed == 1


def _lint(root: Path, save: bool = False):
    """(the sources a run read, its result) of a lint run on ``root`` with the
    project's cache; ``save``: keep what it learnt for the next run."""
    from dp2ddp.cache import LintCache
    from dp2ddp.config import LintConfig
    from dp2ddp.lint import lint_sources
    from dp2ddp.runner import LintRun

    cache = LintCache(root, LintConfig())
    sources = LintRun([root], LintConfig()).read(cache)
    result = lint_sources(sources, LintConfig(), cache=cache)
    if save:
        cache.save()
    return sources, result


def test_warm_lint_does_not_read_files_the_stat_vouches_for(tmp_path):
    root = tmp_path / "p"
    shutil.copytree(FIXTURES / "rules" / "DDP302", root)
    hour_ago = os.stat(root / "bad_every_rank.py").st_mtime_ns - 3600 * 10**9
    for path in root.iterdir():
        os.utime(path, ns=(hour_ago, hour_ago))
    _, cold = _lint(root, save=True)
    sources, warm = _lint(root)
    assert [d.to_dict() for d in warm.diagnostics] == [d.to_dict() for d in cold.diagnostics]
    assert warm.parsed == 0 and cold.diagnostics
    assert not any(sources.is_read(p) for p in sources)  # not even read
    # an edit moves the mtime: read, hashed, analysed again
    edited = root / "good_rank_checks.py"
    edited.write_bytes(edited.read_bytes() + b"\ntorch.save(model.state_dict(), 'x.pt')\n")
    sources, again = _lint(root)
    assert sources.is_read(str(edited)) and again.parsed == 1
    assert any(d.path == str(edited) and d.code == "DDP302" for d in again.diagnostics)


def test_a_file_edited_within_the_mtime_tick_is_not_trusted_by_its_stat(tmp_path):
    # the racy case: an edit that keeps the size and the mtime of a file that
    # was modified just before it was hashed; its content decides
    root = tmp_path / "p"
    shutil.copytree(FIXTURES / "rules" / "DDP302", root)
    target = root / "bad_every_rank.py"
    os.utime(target)  # modified just now (copytree kept the checkout's mtime)
    _, cold = _lint(root, save=True)
    assert any(d.path == str(target) for d in cold.diagnostics)
    before = os.stat(target)
    text = target.read_bytes()
    same_size = text.replace(b"torch.save(", b"torch.Save(")
    assert len(same_size) == len(text) and same_size != text
    target.write_bytes(same_size)
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(target).st_mtime_ns == before.st_mtime_ns
    sources, warm = _lint(root)
    assert sources.is_read(str(target)) and warm.parsed == 1
    assert [d for d in warm.diagnostics if d.path == str(target) and d.code == "DDP302"] == []


def test_lint_cache_on_the_command_line(many, monkeypatch):
    monkeypatch.delenv("DP2DDP_NO_CACHE")
    monkeypatch.chdir(many)
    first = invoke("lint", "--no-config", "--exit-zero", many)
    assert (many / ".dp2ddp_cache" / ".gitignore").read_text().strip().endswith("*")
    second = invoke("lint", "--no-config", "--exit-zero", many)
    third = invoke("lint", "--no-config", "--exit-zero", "--no-cache", "-j", "1", many)
    assert first.stdout == second.stdout == third.stdout
    assert "DDP302" in first.stdout
    # other settings are another cache: never the findings of the last run
    def found(result):  # (file, code) of each finding line
        return {
            (Path(line.split(":", 1)[0]).relative_to(many).parts[0], line.split(": ", 1)[1].split()[0])
            for line in result.stdout.splitlines()
            if ": DDP" in line
        }

    everything = found(first)
    assert {("copy0", "DDP302"), ("copy1", "DDP302"), ("copy0", "DDP304")} <= everything
    ignored = found(invoke("lint", "--no-config", "--exit-zero", "--ignore", "DDP302", many))
    assert ignored == {f for f in everything if f[1] != "DDP302"}
    selected = found(invoke("lint", "--no-config", "--exit-zero", "--select", "DDP302", many))
    assert selected == {f for f in everything if f[1] == "DDP302"}
    (many / "pyproject.toml").write_text('[tool.dp2ddp.per-file-ignores]\n"copy0/*" = ["DDP302"]\n')
    per_file = found(invoke("lint", "--exit-zero", many))
    assert per_file == everything - {("copy0", "DDP302")}
    assert invoke("lint", "--no-config", "--exit-zero", many).stdout == first.stdout


# ------------------------------------------------------------------ convert cache
@pytest.fixture
def program(tmp_path):
    root = tmp_path / "prog"
    shutil.copytree(MULTI, root / "multi")
    (root / "dp").mkdir()
    shutil.copy(DP, root / "dp" / "train.py")
    (root / "legacy.py").write_text("import torch\nprint 'python 2'\n")
    return root


@pytest.fixture
def conversions(monkeypatch):
    """The paths ``engine._convert_one`` is called for (not answered by a cache)."""
    from dp2ddp import engine

    calls = []
    real = engine._convert_one
    monkeypatch.setattr(engine, "_convert_one", lambda job: calls.append(job[0]) or real(job))
    return calls


def _converted(sources, cache=None, **options):
    from dp2ddp.engine import convert_sources

    result = convert_sources(sources, cache=cache, **options)
    return {
        f.path: (f.output, [x.to_dict() for x in f.findings], f.error, f.internal, f.skipped, f.role)
        for f in result.files
    }


def test_convert_results_identical_with_workers(program, monkeypatch):
    # the ast facts go to the process pool too (from 200 files on: here from 1)
    from dp2ddp import engine

    monkeypatch.setattr(engine, "_PARALLEL_FACTS", 1)
    sources = {str(p): p.read_bytes() for p in sorted(program.rglob("*.py"))}
    serial = _converted(sources, verify=False, workers=1)
    assert serial == _converted(sources, verify=False, workers=2)
    assert sum(r[0] is not None and r[0] != sources[p] for p, r in serial.items()) == 4


def test_convert_cache_gives_the_same_results_and_converts_nothing_again(program, conversions, monkeypatch):
    from dp2ddp import engine
    from dp2ddp.cache import ConvertCache

    sources = {str(p): p.read_bytes() for p in sorted(program.rglob("*.py"))}
    plain = _converted(sources)
    cache = ConvertCache(program)
    cold = _converted(sources, cache)
    cache.save()
    conversions.clear()
    parsed = []
    real_facts = engine._facts_one
    monkeypatch.setattr(engine, "_facts_one", lambda item: parsed.append(item[0]) or real_facts(item))
    warm = _converted(sources, ConvertCache(program))
    assert conversions == []  # neither the files nor, for the fixed-point check, their outputs
    assert parsed == []  # nor the ast facts of the files and of their outputs
    assert plain == cold == warm
    changed = [p for p, r in warm.items() if r[0] is not None and r[0] != sources[p]]
    assert len(changed) == 4 and all(warm[p][1] for p in changed)
    assert "cannot parse" in warm[str(program / "legacy.py")][2]


def test_convert_cache_is_keyed_by_content_settings_and_role(program, conversions):
    from dp2ddp.cache import ConvertCache
    from dp2ddp.codemods._base import Settings

    sources = {str(p): p.read_bytes() for p in sorted(program.rglob("*.py"))}
    cache = ConvertCache(program)
    _converted(sources, cache)
    data, model, train = (str(program / "multi" / n) for n in ("data.py", "model.py", "train.py"))

    edited = {**sources, data: sources[data] + b"\n# edited\n"}
    conversions.clear()
    warm = _converted(edited, cache)
    assert set(conversions) == {data}  # the edited file (and its output), nothing else
    assert warm == _converted(edited)

    per_process = Settings(batch_size="per-process")
    conversions.clear()
    warm = _converted(sources, cache, settings=per_process)
    assert {data, model, train} <= set(conversions)
    assert warm == _converted(sources, settings=per_process)

    # without its entry point, the loader's and the model's files are a library:
    # the converted model.py (checked as a fixed point) has another role, so it
    # is converted again
    library = {p: b for p, b in sources.items() if p != train}
    conversions.clear()
    warm = _converted(library, cache)
    assert model in conversions
    assert warm == _converted(library)


@pytest.mark.parametrize("failure", [RuntimeError("boom"), RecursionError("deep")])
def test_convert_cache_keeps_no_internal_error_and_no_stack_overflow(program, monkeypatch, failure):
    # a bug is not remembered, nor is running out of stack: how deep the stack
    # already was depends on where the file was converted, not on the file
    from dp2ddp import codemods
    from dp2ddp.cache import ConvertCache
    from dp2ddp.codemods._base import Transform

    class Broken(Transform):
        NAME = "broken"

        def visit_Module(self, node):
            raise failure

    sources = {str(p): p.read_bytes() for p in sorted((program / "dp").rglob("*.py"))}
    cache = ConvertCache(program)
    with monkeypatch.context() as patch:
        patch.setattr(codemods, "TRANSFORMS", (Broken,))
        (broken,) = _converted(sources, cache).values()
    assert broken[2] and ("too deeply nested" if isinstance(failure, RecursionError) else "boom") in broken[2]
    assert cache.entries == {}
    (fixed,) = _converted(sources, cache).values()
    assert fixed[2] is None and b"DistributedDataParallel(" in fixed[0]


@pytest.mark.parametrize(
    "damaged",
    ["{not json", "[]", '{"version": "0.1.0", "files": []}', '{"version": "0.1.0", "files": {"/x": {"key": 1}}}',
     '{"version": "0.1.0", "files": {"/x": [1, {"key": null}], "/y": {"digest": 3, "hashed_at": "now"}}}',
     '{"version": "0.1.0", "facts": {PATH: {"digest": null, "facts": 3}}}',
     '{"version": "0.1.0", "facts": {PATH: [1, {"digest": null, "facts": 3}]}}',
     '{"version": "0.1.0", "files": {PATH: [{"key": KEY, "output": 5}]}, "facts": {PATH: [{"key": FACTS_KEY, "facts": 3, "error": null}]}}'],
)
def test_a_damaged_cache_file_is_ignored(program, damaged):
    from dp2ddp.cache import CACHE_DIR, ConvertCache, LintCache
    from dp2ddp.config import LintConfig
    from dp2ddp.lint import lint_sources

    sources = {str(p): p.read_bytes() for p in sorted((program / "dp").rglob("*.py"))}
    ((path, data),) = sources.items()
    # entries for the very file converted, of the wrong shape
    damaged = damaged.replace("PATH", json.dumps(os.path.abspath(path)))
    damaged = damaged.replace("FACTS_KEY", json.dumps(ConvertCache._key(path, data)))
    if "KEY" in damaged:
        from dp2ddp.engine import convert_sources

        keys = []
        real_get = ConvertCache.get
        ConvertCache.get = lambda self, job: keys.append(self.job_key(job)) or real_get(self, job)
        try:
            convert_sources(sources, verify=False, cache=ConvertCache(program / "elsewhere"))
        finally:
            ConvertCache.get = real_get
        damaged = damaged.replace("KEY", json.dumps(keys[0]))
    for make in (lambda: ConvertCache(program), lambda: LintCache(program, LintConfig())):
        (program / CACHE_DIR).mkdir(exist_ok=True)
        make().path.write_text(damaged)
        cache = make()
        if isinstance(cache, ConvertCache):
            (converted,) = _converted(sources, cache).values()
            assert b"DistributedDataParallel(" in converted[0]
        else:
            assert lint_sources(sources, LintConfig(), cache=cache).diagnostics


def test_convert_cache_on_the_command_line(program, tmp_path, monkeypatch):
    monkeypatch.delenv("DP2DDP_NO_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    (program / "pyproject.toml").write_text('[project]\nname = "prog"\n')
    monkeypatch.chdir(tmp_path)
    runs = [CliRunner().invoke(cli, ["convert", "-j", "1", str(program)]) for _ in range(2)]
    # the diff writes nothing here nor in the project: the cache is the user's
    assert not (tmp_path / ".dp2ddp_cache").exists() and not (program / ".dp2ddp_cache").exists()
    cache_files = list((tmp_path / "user-cache" / "dp2ddp" / "convert").glob("*/convert-*.json"))
    assert len(cache_files) == 1
    cache_files[0].write_text("{not json")  # a damaged cache is ignored
    runs.append(CliRunner().invoke(cli, ["convert", "-j", "1", str(program)]))
    runs.append(CliRunner().invoke(cli, ["convert", "-j", "1", "--no-cache", str(program)]))
    assert len({(r.exit_code, r.stdout, r.stderr) for r in runs}) == 1
    assert "DistributedDataParallel(" in runs[0].stdout and runs[0].exit_code == 1  # a parse failure
    # --write after a look at the diff: from the cache, and the files are converted
    written = CliRunner().invoke(cli, ["convert", "-j", "1", "--write", "--allow-dirty", str(program)])
    assert "DistributedDataParallel(" in (program / "multi" / "model.py").read_text()
    assert "4 files converted" in written.stderr
    # turned off from the environment: nothing written into the project
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(MULTI, elsewhere)
    monkeypatch.setenv("DP2DDP_NO_CACHE", "1")
    monkeypatch.chdir(elsewhere)
    CliRunner().invoke(cli, ["convert", "-j", "1", str(elsewhere)])
    assert not (elsewhere / ".dp2ddp_cache").exists()
    assert len(list((tmp_path / "user-cache" / "dp2ddp" / "convert").iterdir())) == 1


def test_the_diff_creates_no_cache_folder_in_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("DP2DDP_NO_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user-cache"))
    project = tmp_path / "clone"
    shutil.copytree(MULTI, project)
    (project / "pyproject.toml").write_text('[project]\nname = "prog"\n')
    monkeypatch.chdir(project)  # the quick start: in the clone, on a file of it
    before = sorted(p.name for p in project.iterdir())
    result = CliRunner().invoke(cli, ["convert", "-j", "1", "train.py"])
    assert "init_distributed()" in result.stdout  # (converted: model.py's DataParallel is a spot, it was not given)
    assert sorted(p.name for p in project.iterdir()) == before
    # the cache is kept, in the user's cache folder
    assert list((tmp_path / "user-cache" / "dp2ddp" / "convert").glob("*/convert-*.json"))


def test_convert_answered_from_the_cache_does_not_import_libcst(program, monkeypatch):
    """A warm ``convert --check`` (CI on an unchanged repository) costs what reading
    the files and the cache costs: LibCST (0.3 s to import) and black stay unloaded."""
    monkeypatch.delenv("DP2DDP_NO_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(program.parent / "user-cache"))
    (program / "pyproject.toml").write_text('[project]\nname = "prog"\n')
    code = (
        "import sys\n"
        "from dp2ddp.cli import cli\n"
        "try:\n"
        "    cli(['convert', '--check', '-j', '1', sys.argv[1]])\n"
        "except SystemExit as exc:\n"
        "    print('exit', exc.code)\n"
        "print('heavy', [m for m in ('libcst', 'black', 'torch') if m in sys.modules])\n"
    )
    runs = [
        subprocess.run([sys.executable, "-c", code, str(program)], capture_output=True, text=True)
        for _ in range(2)
    ]
    assert "exit 1" in runs[0].stdout and "'libcst'" in runs[0].stdout, runs[0].stderr  # cold: converts
    assert runs[1].stdout.splitlines() == ["exit 1", "heavy []"], runs[1].stderr
    assert runs[1].stderr == runs[0].stderr  # the same summary, from the cache


def test_stale_cache_files_are_removed_when_a_cache_is_saved(program):
    import time

    from dp2ddp.cache import CACHE_DIR, STALE_SECONDS, ConvertCache

    folder = program / CACHE_DIR
    folder.mkdir()
    month_ago = time.time() - STALE_SECONDS - 60
    old, recent, mine = folder / "lint-0ld.json", folder / "convert-other.json", folder / "notes.json"
    for path in (old, recent, mine):
        path.write_text("{}")
    os.utime(old, (month_ago, month_ago))
    os.utime(mine, (month_ago, month_ago))  # not a cache file of ours: kept
    cache = ConvertCache(program)
    sources = {str(p): p.read_bytes() for p in sorted((program / "dp").rglob("*.py"))}
    _converted(sources, cache, verify=False)
    cache.save()
    assert not old.exists() and recent.exists() and mine.exists() and cache.path.exists()


def test_code_fingerprint_follows_dp2ddp_sources(monkeypatch):
    from dp2ddp import cache
    from dp2ddp.codemods import _names

    before = cache.code_fingerprint()
    edited = os.path.realpath(_names.__file__)
    real_stat = os.stat

    class Stat:  # the file as if saved again a second later
        def __init__(self, st):
            self.st_size, self.st_mtime_ns = st.st_size, st.st_mtime_ns + 10**9

    def stat(path, *args, **kwargs):
        st = real_stat(path, *args, **kwargs)
        return Stat(st) if os.path.realpath(path) == edited else st

    monkeypatch.setattr(cache.os, "stat", stat)
    monkeypatch.setattr(cache, "_FINGERPRINT", None)
    assert cache.code_fingerprint() != before
    monkeypatch.setattr(cache.os, "stat", real_stat)
    monkeypatch.setattr(cache, "_FINGERPRINT", None)
    assert cache.code_fingerprint() == before


def test_interactive_refuses_guards_without_the_process_group(tmp_path):
    # keep the helpers and the rank-0 guards, reject the call that starts the group
    path = _copy_dp(tmp_path)
    from dp2ddp.engine import convert_sources
    from dp2ddp.review import hunks_of

    (file,) = convert_sources({str(path): path.read_bytes()}).files
    hunks = hunks_of(file)
    answers = ["n" if any(line.strip() == "init_distributed()" for line in h.new) else "y" for h in hunks]
    assert "n" in answers
    result = invoke("convert", "--interactive", path, input="\n".join(answers) + "\n")
    assert result.exit_code == 1 and "which it relies on, was rejected" in result.output
    assert path.read_text() == DP.read_text()


def test_launch_files_of_two_entries_with_one_name_do_not_overwrite(tmp_path):
    from dp2ddp.migration import emit_launch

    launch = tmp_path / "launch"
    written = emit_launch(launch, [str(tmp_path / "exp1" / "train.py"), str(tmp_path / "exp2" / "train.py")])
    names = sorted(p.name for p in written)
    assert len(set(names)) == 6 and any(n.endswith("exp1_train.slurm") for n in names)
    assert "exp2/train.py" in (launch / [n for n in names if n.endswith("exp2_train_torchrun.sh")][0]).read_text()


def test_interactive_with_report_is_a_usage_error(tmp_path):
    path = _copy_dp(tmp_path)
    result = invoke("convert", "--interactive", "--report", tmp_path / "r.md", path, input="a\n")
    assert result.exit_code == 2 and "run them separately" in result.output
    assert path.read_text() == DP.read_text()


def test_a_package_entry_with_relative_imports_is_launched_as_a_module(tmp_path):
    from dp2ddp import launch
    from dp2ddp.migration import emit_launch

    package = tmp_path / "proj" / "mypkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text("import torch\n")
    (package / "main.py").write_text("from .model import torch\n\nif __name__ == '__main__':\n    pass\n")
    (tmp_path / "proj" / "script.py").write_text("import torch\n")
    assert launch.module_form(str(package / "main.py")) == (str(tmp_path / "proj"), "mypkg.main")
    assert launch.module_form(str(tmp_path / "proj" / "script.py")) is None
    line = launch.single_node(str(package / "main.py"), "2")
    assert line.endswith("torchrun --standalone --nproc_per_node=2 -m mypkg.main") and line.startswith("cd ")
    written = emit_launch(tmp_path / "launch", [str(package / "main.py")])
    single = next(p for p in written if p.name == "main_torchrun.sh").read_text()
    assert 'cd "$(dirname "$0")"/../proj' in single and "-m mypkg.main" in single


def test_check_with_emit_launch_is_a_usage_error(tmp_path):
    path = _copy_dp(tmp_path)
    result = invoke("convert", "--check", "--emit-launch", tmp_path / "launch", path)
    assert result.exit_code == 2 and not (tmp_path / "launch").exists()


def _converted_texts(files):
    """Each of ``files`` (path -> text), converted as one program, by path (the
    file results themselves; ``_converted`` above gives comparable tuples)."""
    from dp2ddp.engine import convert_sources

    return {f.path: f for f in convert_sources({k: v.encode() for k, v in files.items()}).files}


def test_a_batchnorm_model_of_another_module_gets_the_note_at_the_wrap():
    """The model (with BatchNorm) in models.py, the wrap in train.py: the note that
    BatchNorm now normalises per process is given where the wrap is, as in one file."""
    files = {
        "models.py": "import torch.nn as nn\n\n\nclass Net(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.body = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))\n\n"
        "    def forward(self, x):\n        return self.body(x)\n",
        "train.py": "import torch\nimport torch.nn as nn\n\nfrom models import Net\n\n\ndef main():\n"
        "    net = nn.DataParallel(Net())\n    opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "    net(torch.randn(8, 4)).sum().backward()\n    opt.step()\n\n\n"
        "if __name__ == '__main__':\n    main()\n",
    }
    by_path = _converted_texts(files)
    notes = [(f.line, f.code) for f in by_path["train.py"].findings if "BatchNorm layers now" in f.message]
    assert notes == [(8, "DDP001")]
    # an in-batch-negatives loss of models.py is noted there: the loaders of train.py are sharded
    contrastive = {
        **files,
        "models.py": files["models.py"] + "\n\ndef info_nce(a, b):\n    import torch\n\n"
        "    logits = a @ b.t()\n    return nn.functional.cross_entropy(logits, torch.arange(len(a)))\n",
        "train.py": files["train.py"].replace(
            "    net = nn.DataParallel(Net())\n",
            "    loader = torch.utils.data.DataLoader(torch.randn(8, 4), batch_size=4)\n"
            "    net = nn.DataParallel(Net())\n",
        ),
    }
    by_path = _converted_texts(contrastive)
    assert [(f.line, f.code) for f in by_path["models.py"].findings if "in-batch negatives" in f.message] == [
        (17, "DDP103")
    ]
    # self-attention (q @ k.transpose(), torch.arange positions) is not such a loss
    attention = {
        **contrastive,
        "models.py": files["models.py"] + "\n\ndef attend(q, k):\n    import torch\n\n"
        "    pos = torch.arange(q.size(1))\n    return (q @ k.transpose(-2, -1)).softmax(-1), pos\n",
    }
    by_path = _converted_texts(attention)
    assert not [f for f in by_path["models.py"].findings if "in-batch negatives" in f.message]
    plain = {**files, "models.py": files["models.py"].replace("nn.BatchNorm1d(8)", "nn.ReLU()")}
    by_path = _converted_texts(plain)
    assert not [f for f in by_path["train.py"].findings if "BatchNorm" in f.message]


def test_the_prefix_note_of_a_guarded_wrap_sees_the_checkpoints_of_other_modules():
    """pix2pix: init_net wraps only with GPUs; base_model.py saves the state_dict. The
    converted program always wraps, so the note on the 'module.' prefix of old
    checkpoints is due although the wrapping file never names state_dict."""
    files = {
        "networks.py": "import torch\nimport torch.nn as nn\n\n\ndef init_net(net):\n"
        "    if torch.cuda.device_count() > 1:\n        net = nn.DataParallel(net)\n    return net\n",
        "train.py": "import torch\nimport torch.nn as nn\n\nfrom networks import init_net\n\n\ndef main():\n"
        "    net = init_net(nn.Linear(4, 2))\n    opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "    net(torch.randn(8, 4)).sum().backward()\n    opt.step()\n    torch.save(net.state_dict(), 'net.pth')\n\n\n"
        "if __name__ == '__main__':\n    main()\n",
    }
    by_path = _converted_texts(files)
    assert [f.line for f in by_path["networks.py"].findings if "'module.' prefix" in f.message] == [6]
    without = {**files, "train.py": files["train.py"].replace("    torch.save(net.state_dict(), 'net.pth')\n", "")}
    by_path = _converted_texts(without)
    assert not [f for f in by_path["networks.py"].findings if "'module.' prefix" in f.message]


def test_a_file_kept_open_by_a_helper_of_another_module_is_reported_there():
    """pix2pix's options.py: ``save_opts`` writes opt.txt line by line, and train.py
    calls it on every rank. Lint, one file at a time, cannot tell; convert, which sees
    the program, reports it in the module (a one-shot write there is guarded)."""
    files = {
        "opts.py": "import torch\n\n\ndef save_opts(opt, path):\n    with open(path, 'wt') as f:\n"
        "        for k, v in sorted(opt.items()):\n            f.write(f'{k}: {v}\\n')\n",
        "train.py": "import torch\nimport torch.nn as nn\n\nfrom opts import save_opts\n\n\ndef main():\n"
        "    save_opts({'lr': 0.1}, 'opt.txt')\n    net = nn.DataParallel(nn.Linear(4, 2))\n"
        "    opt = torch.optim.SGD(net.parameters(), lr=0.1)\n    net(torch.randn(8, 4)).sum().backward()\n"
        "    opt.step()\n\n\nif __name__ == '__main__':\n    main()\n",
    }
    by_path = _converted_texts(files)
    spots = [(f.line, f.code) for f in by_path["opts.py"].findings if f.kind == "manual"]
    assert spots == [(5, "DDP302")]
    assert "unless the modules that call this function" in by_path["opts.py"].findings[0].message


def test_a_package_that_re_exports_its_modules_is_one_program(tmp_path):
    """``from .nets import wrap`` where ``nets/__init__.py`` re-exports it from
    ``nets/builder.py`` (an ``__init__`` without torch, which the prefilter keeps
    from being parsed): the import graph follows it, so the entry point gets the
    process group that the converted wrap and loader need -- and the program runs."""
    from dp2ddp.engine import convert_sources

    root = tmp_path / "proj"
    files = {
        "pkg/__init__.py": "",
        "pkg/nets/__init__.py": "from .builder import wrap\n",
        "pkg/nets/builder.py": "import torch.nn as nn\n\n\ndef wrap(model):\n    return nn.DataParallel(model)\n",
        "pkg/data/__init__.py": "from .loader import (\n    build_loader,\n)\n",
        "pkg/data/loader.py": (
            "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n\n\n"
            "def build_loader():\n    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))\n"
            "    return DataLoader(data, batch_size=8, shuffle=True)\n"
        ),
        "pkg/train.py": (
            "import torch\n\nfrom .data import build_loader\nfrom .nets import wrap\n\n\n"
            "def main():\n    model = wrap(torch.nn.Linear(4, 1))\n"
            "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    loader = build_loader()\n"
            "    for epoch in range(2):\n        for x, y in loader:\n"
            "            loss = torch.nn.functional.mse_loss(model(x), y)\n"
            "            opt.zero_grad()\n            loss.backward()\n            opt.step()\n"
            "    if torch.distributed.get_rank() == 0:\n        print('ranks', torch.distributed.get_world_size())\n\n\n"
            "if __name__ == '__main__':\n    main()\n"
        ),
    }
    result = convert_sources({k: v.encode() for k, v in files.items()})
    by_path = {f.path: f for f in result.files}
    assert by_path["pkg/train.py"].role.is_entry
    assert b"init_distributed()" in by_path["pkg/train.py"].output
    assert b"DistributedDataParallel(" in by_path["pkg/nets/builder.py"].output
    assert b"DistributedSampler(" in by_path["pkg/data/loader.py"].output
    assert not by_path["pkg/train.py"].output.count(b"DistributedDataParallel(")  # wrapped once, in builder
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        out = by_path[name].output
        (root / name).write_bytes(out if out is not None else text.encode())
    run = subprocess.run(
        [*torchrun_cmd(), str(RANK_LOG), "-m", "pkg.train"],
        cwd=root, env=script_env(tmp_path), capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ranks 2" in run.stdout


@pytest.mark.parametrize(
    "setup",
    [
        'sys.path.insert(0, "lib")\n',
        'sys.path.insert(0, os.path.join(os.path.dirname(__file__), "lib"))\n',
        "import _init_paths\n",  # HRNet: a module without torch that edits sys.path
    ],
)
def test_imports_resolve_through_folders_put_on_sys_path(setup):
    from dp2ddp.engine import convert_sources

    files = {
        "tools/_init_paths.py": (
            "import os.path as osp\nimport sys\n\n\ndef add_path(path):\n    sys.path.insert(0, path)\n\n\n"
            "this_dir = osp.dirname(__file__)\nadd_path(osp.join(this_dir, 'lib'))\n"
        ),
        "tools/lib/engine.py": (
            "import torch\n\n\ndef save(model, path):\n    torch.save(model.state_dict(), path)\n"
        ),
        "tools/train.py": (
            "import os\nimport sys\n\nimport torch\n" + setup + "from engine import save\n\n\n"
            "def main():\n    model = torch.nn.DataParallel(torch.nn.Linear(4, 1))\n"
            "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    loader = torch.utils.data.DataLoader(torch.randn(8, 4), batch_size=4, shuffle=True)\n"
            "    for epoch in range(2):\n        for x in loader:\n            opt.zero_grad()\n"
            "            model(x).sum().backward()\n            opt.step()\n        save(model, 'm.pt')\n\n\n"
            "if __name__ == '__main__':\n    main()\n"
        ),
    }
    result = convert_sources({k: v.encode() for k, v in files.items()})
    engine = next(f for f in result.files if f.path == "tools/lib/engine.py")
    assert engine.role is not None and engine.role.in_program
    assert engine.output is not None and b"get_rank() == 0" in engine.output  # its save: rank 0 only


def test_launch_files_quote_paths_and_take_nproc(tmp_path):
    """A project folder named with quotes, $ and backticks stays a name in the
    launch files; --nproc-per-node is their default; without --write (nothing
    converted yet) none are written."""
    from dp2ddp.migration import emit_launch

    project = tmp_path / "it's $HOME `x` proj"
    project.mkdir()
    entry = project / "train.py"
    shutil.copy(DP, entry)
    result = invoke("convert", "--emit-launch", tmp_path / "early", entry)
    assert "not converted yet (add --write)" in result.output and not (tmp_path / "early").exists()
    written = emit_launch(project / "launch", [str(entry)], nproc="4")
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in ("torchrun", "srun"):  # print the arguments, one per line
        (fake / name).write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
        (fake / name).chmod(0o755)
    (fake / "scontrol").write_text("#!/bin/sh\necho node0\n")
    (fake / "scontrol").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}", "RDZV_HOST": "node0",
           "SLURM_JOB_NODELIST": "node0", "SLURM_NNODES": "1", "SLURM_JOB_ID": "7"}
    for path in written:
        subprocess.run(["bash", "-n", str(path)], check=True)
        run = subprocess.run(["bash", str(path), "--epochs", "1"], env=env, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        args = run.stdout.splitlines()
        target = args[-3]  # ... SCRIPT --epochs 1 (srun prints "torchrun" first)
        assert os.path.realpath(target) == os.path.realpath(entry), args
        assert args[-2:] == ["--epochs", "1"]
        if not path.name.endswith(".slurm"):
            assert "--nproc_per_node=4" in args, args


def test_interactive_refuses_sharded_data_without_the_wrap_in_another_file(tmp_path):
    """The sampler kept (data.py) while the DDP wrap is rejected (model.py): each
    process would train its own copy on its shard -- refused, nothing written."""
    from dp2ddp.engine import convert_sources
    from dp2ddp.review import hunks_of

    project = tmp_path / "proj"
    copy_tree(FIXTURES / "e2e" / "multi_file" / "before", project)
    before = {p.name: p.read_text() for p in project.glob("*.py")}
    result = convert_sources({str(p): p.read_bytes() for p in sorted(project.glob("*.py"))})
    answers = []
    for file in sorted(result.changed, key=lambda f: f.path):
        for hunk in hunks_of(file):
            answers.append("n" if "DDP001" in hunk.codes else "y")
    assert "n" in answers
    out = invoke("convert", "--interactive", project, input="\n".join(answers) + "\n")
    assert out.exit_code == 1 and "DDP101 is kept but DDP001" in out.output, out.output
    assert {p.name: p.read_text() for p in project.glob("*.py")} == before


def test_an_edit_whose_mtime_is_set_back_is_not_trusted_by_its_stat(tmp_path):
    """``touch -r`` after a same-size edit keeps size and mtime; the ctime moves."""
    root = tmp_path / "p"
    shutil.copytree(FIXTURES / "rules" / "DDP302", root)
    target = root / "bad_every_rank.py"
    hour_ago = os.stat(target).st_mtime_ns - 3600 * 10**9
    os.utime(target, ns=(hour_ago, hour_ago))
    _, cold = _lint(root, save=True)
    assert any(d.path == str(target) and d.code == "DDP302" for d in cold.diagnostics)
    text = target.read_bytes()
    target.write_bytes(text.replace(b"torch.save(", b"torch.Save("))
    os.utime(target, ns=(hour_ago, hour_ago))
    sources, warm = _lint(root)
    assert sources.is_read(str(target))
    assert [d for d in warm.diagnostics if d.path == str(target) and d.code == "DDP302"] == []


def test_many_entry_points_get_a_few_launch_lines_and_a_count(tmp_path):
    from dp2ddp.launch import LISTED_ENTRIES

    count = LISTED_ENTRIES + 3
    for index in range(count):
        target = tmp_path / f"exp{index}" / "train.py"
        target.parent.mkdir()
        shutil.copy(DP, target)
    result = invoke("convert", tmp_path)
    assert result.exit_code == 0, result.output
    launches = [line for line in result.output.splitlines() if line.startswith("  torchrun ")]
    assert len(launches) == 2 * (LISTED_ENTRIES - 2), launches
    more = count - (LISTED_ENTRIES - 2)
    assert result.output.count(f"... and {more} more entry points, likewise") == 2
    # up to LISTED_ENTRIES, every one is listed
    for index in range(LISTED_ENTRIES, count):
        shutil.rmtree(tmp_path / f"exp{index}")
    listed = invoke("convert", tmp_path)
    assert len([line for line in listed.output.splitlines() if line.startswith("  torchrun ")]) == 2 * LISTED_ENTRIES
    assert "more entry point" not in listed.output
