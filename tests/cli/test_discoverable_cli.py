"""A discoverable command line (issue 36, item 6): --help lists the kernels and the presets
without importing torch or CuTeDSL, and a token count that is not a bucket says which bucket
serves it, each bucket planned once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import cutetune.kernels
from cutetune.cli.main import cli
from cutetune.cli.options import bucket_note, token_buckets
from cutetune.kernels.registry import get_kernel, kernel_names
from cutetune.spaces.models import PRESETS


def registered_kernels() -> list[str]:
    """The kernels cutetune's own modules register (a test may register others)."""
    package = Path(cutetune.kernels.__file__).resolve().parent
    return [name for name in kernel_names()
            if Path(get_kernel(name).source_file).resolve().is_relative_to(package)]


def help_text(*command: str) -> str:
    result = CliRunner().invoke(cli, [*command, "--help"], terminal_width=1000)
    assert result.exit_code == 0, result.output
    return result.output


# Each command with what its --help lists: the kernels where it takes a kernel (argument or
# --kernel), the presets where it takes --model.
COMMANDS = [
    ((), True, True),
    (("plan",), True, True),
    (("tune",), True, True),
    (("bench",), True, True),
    (("export",), True, True),
    (("show",), True, False),
    (("report",), False, True),
    (("cache", "build"), False, True),
]


@pytest.mark.parametrize(("command", "kernels", "presets"), COMMANDS,
                         ids=[" ".join(c[0]) or "cutetune" for c in COMMANDS])
def test_help_lists_every_kernel_and_preset(command, kernels, presets):
    text = help_text(*command)
    if kernels:
        assert f"Kernels: {', '.join(registered_kernels())}." in text
    if presets:
        assert f"Presets for --model: {', '.join(sorted(PRESETS))};" in text


def test_help_imports_neither_torch_nor_cutedsl():
    """Nor the dispatcher's modules, which `import cutetune` leaves to the first warmup: they
    were a third of --help's time."""
    script = ("import sys\n"
              "from cutetune.cli.main import cli\n"
              "for args in (['--help'], ['plan', '--help'], ['tune', '--help'],\n"
              "             ['cache', 'build', '--help']):\n"
              "    try:\n"
              "        cli.main(args=args, prog_name='cutetune')\n"
              "    except SystemExit:\n"
              "        pass\n"
              "print('loaded:', *[m for m in ('torch', 'cutlass', 'cutetune.serving.table')\n"
              "                 if m in sys.modules])\n")
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           check=True).stdout
    assert "qk_norm" in shown and "qwen3-8b" in shown
    assert shown.splitlines()[-1] == "loaded:"


@pytest.mark.parametrize(("tokens", "note"), [
    ((3, 5, 7), "token count 3 is served by bucket 4; 5 and 7 by bucket 8"),
    ((5, 6, 7, 9), "token counts 5, 6 and 7 are served by bucket 8; 9 by bucket 16"),
    ((100, 3), "token count 3 is served by bucket 4; 100 by bucket 128"),
    ((1, 8, 64), None),
    ((1048575,), "token count 1048575 is served by bucket 1048576"),
])
def test_a_count_that_is_not_a_bucket_names_its_bucket(tokens, note):
    assert bucket_note(tokens) == note


def test_each_bucket_is_planned_once_in_order():
    assert token_buckets((64, 3, 5, 7, 8)) == (4, 8, 64)


def test_plan_of_3_5_7_plans_buckets_4_and_8_once_and_says_why():
    result = CliRunner().invoke(cli, ["plan", "qk_norm", "-m", "qwen3-8b", "--tokens", "3,5,7",
                                      "--top", "1"])
    assert result.exit_code == 0, result.output
    planned = [line for line in result.stdout.splitlines() if line.startswith("QKNormProblem")]
    assert [line.split("tokens=")[1].split(")")[0] for line in planned] == ["4", "8"]
    assert result.stderr.splitlines() == [
        "token count 3 is served by bucket 4; 5 and 7 by bucket 8"]


def test_a_count_given_twice_is_planned_once_without_a_note():
    result = CliRunner().invoke(cli, ["plan", "qk_norm", "-m", "qwen3-8b", "--tokens", "8,8",
                                      "--top", "1"])
    assert result.exit_code == 0, result.output
    assert result.stdout.count("tokens=8)") == 1
    assert result.stderr == ""


def test_a_failing_plan_says_only_its_error():
    """The bucket note comes once the command's input is checked, not before its error."""
    result = CliRunner().invoke(cli, ["plan", "qk_norm", "-m", "nosuch", "--tokens", "3"])
    assert result.exit_code == 2
    assert "unknown model 'nosuch'" in result.output and "token count" not in result.output
