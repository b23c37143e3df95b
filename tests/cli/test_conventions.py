"""The command line follows click's conventions (issue 37, item 4): each command in its own
module behind a lazily loading group, --db declared once with its environment variable, one
--device type from the device table, one --tokens default."""

from __future__ import annotations

import dataclasses
import importlib
import shutil
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from cutetune.cli.main import COMMANDS, cli
from cutetune.device.specs import DEVICE_SPECS
from cutetune.results_db import Database, record_ceilings, winners_with_devices
from cutetune.spaces.buckets import DEFAULT_TUNE_TOKENS
from testkit.h200_results import H200_RESULTS


def one_error_line(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    return errors[0]


# -- the lazy group ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_lives_in_its_own_module_under_its_name(name):
    module, attribute = COMMANDS[name].split(":")
    command = getattr(importlib.import_module(module), attribute)
    assert isinstance(command, click.Command) and command.name == name
    assert module == f"cutetune.cli.{attribute}"


def test_help_lists_every_command_with_its_summary():
    text = CliRunner().invoke(cli, ["--help"], terminal_width=1000).output
    listed = text.split("Commands:\n")[1].split("\n\n")[0].splitlines()
    summaries = {line.split()[0]: line.split(None, 1)[1] for line in listed}
    assert list(summaries) == sorted(COMMANDS)
    context = click.Context(cli)
    for name, summary in summaries.items():
        assert summary == cli.get_command(context, name).get_short_help_str(limit=1000)


def loaded_after(args: list[str], modules: tuple[str, ...]) -> list[str]:
    """Which of `modules` a fresh process has imported after `cutetune ARGS`."""
    script = ("import sys\n"
              "from cutetune.cli.main import cli\n"
              "try:\n"
              f"    cli.main(args={args!r}, prog_name='cutetune')\n"
              "except SystemExit:\n"
              "    pass\n"
              f"print(' '.join(m for m in {modules!r} if m in sys.modules))\n")
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           check=True).stdout
    return shown.splitlines()[-1].split()


def test_help_imports_no_library_a_command_imports_when_it_runs():
    heavy = ("torch", "cutlass", "sqlalchemy", "pandas", "optuna", "tqdm",
             "cutetune.device.specs", "cutetune.results_db", "cutetune.kernels.registry")
    assert loaded_after(["--help"], heavy) == []


def test_a_command_imports_no_other_commands_module():
    others = tuple(target.split(":")[0] for name, target in COMMANDS.items() if name != "show")
    assert loaded_after(["show", "--help"], others) == []


# -- --db -------------------------------------------------------------------------------------


def missing_db(tmp_path, name: str) -> str:
    return f"sqlite:///{tmp_path / name}"


@pytest.mark.parametrize(("args", "used"), [
    (["show"], "env.db"),
    (["--db", "{group}", "show"], "group.db"),
    (["report", "--model", "qwen3-8b", "--format", "md"], "env.db"),
    (["--db", "{group}", "report", "--model", "qwen3-8b", "--format", "md"], "group.db"),
    (["--db", "{group}", "report", "--model", "qwen3-8b", "--format", "md", "--db", "{own}"],
     "own.db"),
    (["report", "--model", "qwen3-8b", "--format", "md", "--db", "{own}"], "own.db"),
], ids=["env", "group-over-env", "report-env", "report-group-over-env", "report-own-over-group",
        "report-own-over-env"])
def test_db_comes_from_the_command_line_then_cutetune_db(tmp_path, monkeypatch, args, used):
    """--db given to a command (report) wins, then --db given to the group, then CUTETUNE_DB;
    which one was used shows in the error naming the missing file."""
    monkeypatch.setenv("CUTETUNE_DB", missing_db(tmp_path, "env.db"))
    args = [arg.format(group=missing_db(tmp_path, "group.db"), own=missing_db(tmp_path, "own.db"))
            for arg in args]
    error = one_error_line(CliRunner().invoke(cli, args))
    assert f"cannot open the database {missing_db(tmp_path, used)}: no such file" in error


def test_db_is_declared_once_with_its_environment_variable():
    """The group and report take the same option, which names CUTETUNE_DB in their help."""
    report = cli.get_command(click.Context(cli), "report")
    group_db, report_db = ([(p.opts, p.envvar, p.help, p.callback) for p in command.params
                            if p.name == "db_url"] for command in (cli, report))
    assert group_db == report_db and group_db[0][1] == "CUTETUNE_DB"
    for args in (["--help"], ["report", "--help"]):
        assert "[env var: CUTETUNE_DB]" in CliRunner().invoke(cli, args,
                                                              terminal_width=1000).output


# -- --device ---------------------------------------------------------------------------------


def test_device_choices_are_the_device_table():
    for command in (["plan"], ["cache", "build"], ["report"]):
        text = CliRunner().invoke(cli, [*command, "--help"], terminal_width=1000).output
        assert f"--device [{'|'.join(DEVICE_SPECS)}]" in text


@pytest.mark.parametrize(("given", "spec"), [
    ("H200", "H200"), ("h200", "H200"), ("H100 SXM", "H100 SXM"), ("b200", "B200"),
    ("NVIDIA H100 80GB HBM3", "H100 SXM")])
def test_a_device_is_named_by_its_table_name_in_any_case_or_its_cuda_name(given, spec):
    result = CliRunner().invoke(cli, ["plan", "qk_norm", "-m", "qwen3-8b", "--tokens", "1",
                                      "--top", "1", "--device", given])
    assert result.exit_code == 0, result.output
    assert f" on {spec}\n" in result.stdout


@pytest.mark.parametrize("command", [["plan", "qk_norm"], ["cache", "build"], ["report"]])
def test_an_unknown_device_is_one_line_naming_the_known_ones(command):
    error = one_error_line(CliRunner().invoke(cli, [*command, "-m", "qwen3-8b", "--device",
                                                    "A100"]))
    assert "--device" in error and "'A100'" in error
    assert all(name in error for name in DEVICE_SPECS)


def test_report_of_a_device_named_by_its_table_name(tmp_path):
    """The H100 SXM of the device table is the GPU CUDA names NVIDIA H100 80GB HBM3."""
    path = tmp_path / "two-devices.db"
    shutil.copy(H200_RESULTS, path)
    path.chmod(0o644)
    db = Database.open(f"sqlite:///{path}")
    h200 = winners_with_devices(db)[0][0]
    record_ceilings(db, dataclasses.replace(h200, gpu_name="NVIDIA H100 80GB HBM3"),
                    {"copy_gbps": 3000.0})
    db.dispose()
    result = CliRunner().invoke(cli, ["--db", f"sqlite:///{path}", "report", "-m", "qwen3-8b",
                                      "--format", "md", "--device", "H100 SXM"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("# Tuning report: qwen3-8b on NVIDIA H100 80GB HBM3")


# -- --tokens ---------------------------------------------------------------------------------


def test_every_command_taking_tokens_has_the_same_default():
    default = "[default: every power of two from 1 to 32768]"
    for command in ("plan", "tune", "bench"):
        text = CliRunner().invoke(cli, [command, "--help"], terminal_width=1000).output
        assert default in " ".join(text.split()), command
    result = CliRunner().invoke(cli, ["plan", "qk_norm", "-m", "qwen3-8b", "--top", "1"])
    assert result.exit_code == 0, result.output
    planned = [line.split("tokens=")[1].split(")")[0] for line in result.stdout.splitlines()
               if line.startswith("QKNormProblem")]
    assert planned == [str(n) for n in DEFAULT_TUNE_TOKENS]
