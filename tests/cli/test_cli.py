"""The click commands through CliRunner: plan, tune and bench (without a GPU), show, export.

Results are stored with tune_bucket and a fake runner, so nothing here needs a GPU or compiles.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

import click
import pytest
import torch
from click.testing import CliRunner

from cutetune.cli.main import cli
from cutetune.device.funnel import make_plan
from cutetune.kernels import qk_norm as qk
from cutetune.kernels.registry import NotApplicableError, get_kernel, kernel_names
from cutetune.results_db import (
    Database,
    QuarantinedPoint,
    record_quarantine,
    shipped_winners,
    winners,
    winners_with_devices,
)
from cutetune.spaces.models import load_model
from cutetune.spaces.space import config_to_json
from cutetune.tuner.tune import plan_bucket, tune_bucket
from testkit.fake_qk_runner import CEILINGS, FINGERPRINT, SPEC, FakeRunner
from testkit.malformed_configs import BAD_MODEL_PATHS, BASE_OF_FIELD, MALFORMED
from testkit.stored_winners import winner

STORED_BUCKETS = (8, 4096)
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(),
                            reason="checks the behaviour where no CUDA GPU is visible")


def invoke(db_url: str, *args: str):
    return CliRunner().invoke(cli, ["--db", db_url, *args])


def assert_clean_error(result, *fragments: str) -> None:
    """Non-zero exit, the message in the output, and no traceback."""
    assert result.exit_code != 0, result.output
    assert "Traceback" not in result.output
    # click.UsageError/BadParameter end as SystemExit(2); any other exception is a crash.
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    for fragment in fragments:
        assert fragment in errors[0], result.output


@pytest.fixture
def empty_db(tmp_path: Path) -> str:
    """The URL of a database not created yet: a command that writes creates it, one that only
    reads refuses it."""
    return f"sqlite:///{tmp_path / 'x.db'}"


@pytest.fixture
def created_db(tmp_path: Path) -> str:
    """An empty database with cutetune's tables, as a tune that stored nothing leaves."""
    url = f"sqlite:///{tmp_path / 'created.db'}"
    Database.open(url).dispose()
    return url


@pytest.fixture(scope="module")
def stored_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A DB holding qk_norm winners of Qwen3-8B at STORED_BUCKETS, from a fake runner."""
    url = f"sqlite:///{tmp_path_factory.mktemp('stored') / 'x.db'}"
    db = Database.open(url)
    static = qk.problems_for_model(load_model("qwen3-8b"), "bfloat16")[0]
    for bucket in STORED_BUCKETS:
        result = tune_bucket(plan_bucket(qk.KERNEL, static, bucket, SPEC, CEILINGS),
                             FakeRunner(), db, FINGERPRINT, budget=2)
        assert result.winner is not None
    db.dispose()
    return url


# -- plan ---------------------------------------------------------------------------------


def test_plan_shows_funnel_ranking_and_default(empty_db):
    result = invoke(empty_db, "plan", "qk_norm", "--model", "qwen3-8b", "--tokens", "1,32768")
    assert result.exit_code == 0, result.output
    out = result.output
    assert out.count("declared 90") == 2  # one funnel per token count
    assert "tokens=1)" in out and "tokens=32768)" in out
    assert "q_heads=32 kv_heads=8" in out
    assert "    1. " in out and "    5. " in out and "    6. " not in out  # --top 5
    assert out.count("default: {") == 2
    assert '"vector_bits": 128' in out


def test_plan_rounds_token_counts_up_to_their_bucket(empty_db):
    result = invoke(empty_db, "plan", "qk_norm", "-m", "qwen3-8b", "--tokens", "3", "--top", "2")
    assert result.exit_code == 0, result.output
    assert "tokens=4)" in result.output and "tokens=3)" not in result.output
    assert "    2. " in result.output and "    3. " not in result.output


def test_plan_keeps_the_winner_another_problem_lends_as_the_tuner_does(stored_db):
    # stored_db's Qwen3-8B winner at 8 tokens is lent to Qwen3-30B-A3B's problem (other head
    # counts) at that bucket: the plan keeps it whatever its prediction, and names the lender.
    qwen3_8b = qk.problems_for_model(load_model("qwen3-8b"), "bfloat16")[0].static_key()
    result = invoke(stored_db, "plan", "qk_norm", "-m", "qwen3-30b-a3b", "--tokens", "8",
                    "--top", "90")
    assert result.exit_code == 0, result.output
    assert result.output.count(f"(lent by qk_norm {qwen3_8b})") == 1
    at_4096 = invoke(stored_db, "plan", "qk_norm", "-m", "qwen3-30b-a3b", "--tokens", "4096",
                     "--top", "90")
    assert at_4096.output.count(f"(lent by qk_norm {qwen3_8b})") == 1
    # Its own problem is never lent its own winner.
    own = invoke(stored_db, "plan", "qk_norm", "-m", "qwen3-8b", "--tokens", "8", "--top", "90")
    assert f"(lent by qk_norm {qwen3_8b})" not in own.output


def test_plan_keeps_and_names_the_problems_shipped_winner_as_the_incumbent(empty_db,
                                                                           monkeypatch):
    from cutetune.results_db import shipped

    static = qk.problems_for_model(load_model("qwen3-8b"), "bfloat16")[0]
    plan = make_plan(qk.KERNEL, static.with_tokens(8), SPEC, CEILINGS)
    last = plan.kept[-1].config  # the roofline ranks it last of the points it keeps
    monkeypatch.setattr(shipped, "shipped_with_devices", lambda: [
        (FINGERPRINT, winner(qk.KERNEL, static, 8, last))])
    result = invoke(empty_db, "plan", "qk_norm", "-m", "qwen3-8b", "--tokens", "8,64",
                    "--top", "90")
    assert result.exit_code == 0, result.output
    marked = [line for line in result.output.splitlines() if "(the incumbent" in line]
    assert len(marked) == 1 and config_to_json(last) in marked[0]  # at its bucket only
    # Another model's problem is lent it instead.
    other = invoke(empty_db, "plan", "qk_norm", "-m", "qwen3-30b-a3b", "--tokens", "8",
                   "--top", "90")
    assert "(the incumbent" not in other.output
    assert f"(lent by qk_norm {static.static_key()})" in other.output


@pytest.mark.parametrize("as_dir", [False, True], ids=["file", "directory"])
def test_plan_reads_a_hf_config(empty_db, tmp_path, as_dir):
    model_dir = tmp_path / "my-qwen3"
    model_dir.mkdir()
    config = model_dir / "config.json"
    config.write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "rms_norm_eps": 1e-6,
        "intermediate_size": 6144,
    }))
    model = str(model_dir if as_dir else config)
    result = invoke(empty_db, "plan", "qk_norm", "--model", model, "--tokens", "64")
    assert result.exit_code == 0, result.output
    assert "q_heads=16 kv_heads=4" in result.output
    assert "declared 90" in result.output and "default:" in result.output


@pytest.mark.parametrize(("args", "fragments"), [
    (["qk_norm", "--model", "no-such-model"], ["unknown model 'no-such-model'", "--model"]),
    (["qk_norm", "--model", "llama-3.1-8b"], ["llama-3.1-8b", "does not normalise q and k"]),
    (["no_such_kernel", "--model", "qwen3-8b"], ["no_such_kernel", "qk_norm"]),
    (["qk_norm", "--model", "qwen3-8b", "--tokens", "0"], ["--tokens", "from 1 to 1048576"]),
    (["qk_norm", "--model", "qwen3-8b", "--tokens", "1,-4"], ["--tokens", "from 1 to 1048576"]),
    (["qk_norm", "--model", "qwen3-8b", "--tokens", "99999999999999999999"],
     ["--tokens", "from 1 to 1048576"]),
    (["qk_norm", "--model", "qwen3-8b", "--tokens", "abc"], ["--tokens", "'abc'"]),
    (["qk_norm", "--model", "qwen3-8b", "--dtype", "int8"], ["--dtype", "int8", "bfloat16"]),
], ids=["unknown-model", "no-qk-norm", "unknown-kernel", "tokens-0", "tokens-negative",
        "tokens-huge", "tokens-abc", "bad-dtype"])
def test_plan_errors_are_one_clear_line(empty_db, args, fragments):
    assert_clean_error(invoke(empty_db, "plan", *args), *fragments)


def test_plan_needs_a_model(empty_db):
    assert_clean_error(invoke(empty_db, "plan", "qk_norm"), "--model")


# -- tune -----------------------------------------------------------------------------------


@NO_GPU
@pytest.mark.parametrize("kernel", [["qk_norm"], []], ids=["one-kernel", "whole-model"])
def test_tune_without_a_gpu_says_it_needs_one(empty_db, tmp_path, kernel):
    result = invoke(empty_db, "tune", *kernel, "--model", "qwen3-8b", "--tokens", "1")
    assert_clean_error(result, "needs a CUDA GPU")
    assert not (tmp_path / "x.db").exists()  # it stopped before opening the DB
    # A whole-model run says which kernels the model does not use, and why.
    assert ("skipping moe_dispatch: model qwen3-8b has no routed experts" in result.output) \
        == (not kernel)


@pytest.mark.parametrize(("args", "fragments"), [
    (["--model", "nosuch"], ["--model", "unknown model 'nosuch'"]),
    (["moe_dispatch", "--model", "qwen3-8b"], ["MoE kernels do not apply", "qwen3-8b"]),
    (["qk_norm", "--model", "qwen3-8b", "--tokens", "1,2097152"],
     ["--tokens", "from 1 to 1048576"]),
    (["nosuch", "--model", "qwen3-8b"], ["unknown kernel 'nosuch'", "qk_norm"]),
    (["--model", "qwen3-8b", "--trials", "0"], ["--trials"]),
    (["--model", "qwen3-8b", "--tie-band", "12"],
     ["--tie-band", "12.0 is not in the range 0<=x<=10"]),
    (["--model", "qwen3-8b", "--tie-band", "-0.5"],
     ["--tie-band", "-0.5 is not in the range 0<=x<=10"]),
    (["--model", "qwen3-8b", "--tie-band", "nan"],
     ["--tie-band", "'nan' is not a finite number (0<=x<="]),
    (["--model", "qwen3-8b", "--trial-timeout", "nan"],
     ["--trial-timeout", "'nan' is not a finite number (x>=1)"]),
    (["--model", "qwen3-8b", "--trial-timeout", "inf"],
     ["--trial-timeout", "'inf' is not a finite number (x>=1)"]),
    (["--model", "qwen3-8b", "--gpus", "0,0"],
     ["--gpus", "GPU numbers must be distinct and at least 0, got '0,0'"]),
    (["--model", "qwen3-8b", "--gpus", "first"],
     ["--gpus", "'first' is not a comma-separated list of GPU numbers, e.g. 0,1"]),
], ids=["unknown-model", "not-in-model", "tokens-too-many", "unknown-kernel", "no-trials",
        "tie-band-too-wide", "tie-band-negative", "tie-band-nan", "trial-timeout-nan",
        "trial-timeout-inf", "same-gpu-twice", "gpus-not-numbers"])
def test_tune_errors_are_one_clear_line_before_any_work(empty_db, tmp_path, args, fragments):
    assert_clean_error(invoke(empty_db, "tune", *args), *fragments)
    assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize(("args", "band"), [([], 0.03), (["--tie-band", "0.5"], 0.005),
                                             (["--tie-band", "0"], 0.0)])
def test_the_tie_band_reaches_the_run_as_a_fraction(empty_db, monkeypatch, args, band):
    import torch

    from cutetune.tuner import model_run

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    runs = []
    monkeypatch.setattr(model_run, "tune_model", lambda *arguments: runs.append(arguments) or [])
    result = invoke(empty_db, "tune", "qk_norm", "--model", "qwen3-8b", "--tokens", "1", *args)
    assert result.exit_code == 0, result.output
    ((*_, options, _observer),) = runs
    assert options.tie_band == pytest.approx(band)


def test_tune_on_a_gpu_this_machine_does_not_show_is_one_clear_line(empty_db, tmp_path,
                                                                    monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    result = invoke(empty_db, "tune", "qk_norm", "--model", "qwen3-8b", "--gpus", "0,2")
    assert_clean_error(result, "--gpus 0,2: GPU 2 is not visible; this machine shows 2 (0 to 1)")
    assert not (tmp_path / "x.db").exists()


def test_a_database_that_takes_no_writes_is_one_clear_line(tmp_path):
    from cutetune.cli.context import Context

    path = tmp_path / "x.db"
    Database.open(f"sqlite:///{path}").dispose()
    context = Context(f"sqlite:///file:{path}?mode=ro&uri=true")
    context.open_db()  # reading is fine
    with pytest.raises(click.BadParameter, match="cannot write to the database .*readonly"):
        context.open_db(writable=True)


def test_shown_urls_mask_the_password():
    from cutetune.cli.context import Context

    shown = Context("postgresql://tuner:s3cret@db.example:5432/cutetune").shown_url
    assert "s3cret" not in shown and shown.startswith("postgresql://tuner:***@db.example")


# -- bench ----------------------------------------------------------------------------------


@NO_GPU
def test_bench_without_a_gpu_says_it_needs_one(empty_db):
    result = invoke(empty_db, "bench", "qk_norm", "--model", "qwen3-8b", "--tokens", "1")
    assert_clean_error(result, "needs a CUDA GPU")


def test_bench_rejects_an_unknown_kernel(empty_db):
    result = invoke(empty_db, "bench", "no_such_kernel", "--model", "qwen3-8b")
    assert_clean_error(result, "Invalid value", "unknown kernel 'no_such_kernel'", "rmsnorm")


# -- show -----------------------------------------------------------------------------------


def test_show_on_an_empty_db(created_db):
    result = invoke(created_db, "show")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "no winners stored"
    result = invoke(created_db, "show", "--kernel", "qk_norm")
    assert result.output.strip() == "no winners stored for qk_norm"


@pytest.mark.parametrize("flags", [pytest.param([], marks=NO_GPU), ["--all-devices"]],
                         ids=["no-gpu-all-devices", "all-devices-flag"])
def test_show_lists_stored_winners(stored_db, flags):
    result = invoke(stored_db, "show", *flags)
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    header, rows = lines[0], lines[1:]
    assert {"kernel_name", "bucket", "config_json", "gpu_name"} <= set(header.split())
    assert len(rows) == len(STORED_BUCKETS)
    # Columns are right-aligned under their names (the JSON columns contain spaces).
    bucket_end = header.index(" bucket ") + len(" bucket")
    assert [row[:bucket_end].split()[-1] for row in rows] == [str(b) for b in STORED_BUCKETS]
    assert all(row.split()[0] == "qk_norm" for row in rows)
    assert "NVIDIA H200" in result.output


def test_show_failed_lists_the_quarantined_points_with_their_reasons(stored_db, created_db):
    record_quarantine(Database.open(stored_db), FINGERPRINT, QuarantinedPoint(
        "qk_norm", qk.KERNEL.source_hash(), "{}", '{"warps_per_block": 32}', 4096,
        "hang: no answer in 31 s", datetime.now(UTC)))
    result = invoke(stored_db, "show", "--failed", "--all-devices")
    assert result.exit_code == 0, result.output
    header, row = result.output.strip().splitlines()
    assert {"kernel", "config", "reason", "gpu_name"} <= set(header.split())
    assert "hang: no answer in 31 s" in row and "warps_per_block" in row
    assert invoke(created_db, "show", "--failed").output.strip() == "no quarantined points"


def test_show_filters_by_kernel(stored_db):
    result = invoke(stored_db, "show", "--all-devices", "--kernel", "rmsnorm")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "no winners stored for rmsnorm"


# -- export ---------------------------------------------------------------------------------


def test_export_json_to_stdout(stored_db):
    result = invoke(stored_db, "export", "--format", "json", "--all-devices")
    assert result.exit_code == 0, result.output
    records = json.loads(result.stdout)
    assert [(r["kernel_name"], r["bucket"]) for r in records] == [
        ("qk_norm", b) for b in STORED_BUCKETS]
    for record in records:
        assert record["gpu_name"] == "NVIDIA H200" and record["sm_count"] == 132
        assert set(record["config"]) == {"vector_bits", "heads_per_warp", "warps_per_block"}
        assert record["config"]["vector_bits"] != 32  # FakeRunner fails those
        assert record["median_us"] > 0
        assert record["source_hash"] == qk.KERNEL.source_hash()


def test_export_of_a_model_keeps_only_the_problems_it_uses(stored_db):
    """A model with those problems keeps every winner; one without (Llama has no QK-norm, and
    another hidden size) keeps none."""
    def exported(model):
        result = invoke(stored_db, "export", "--format", "json", "--all-devices",
                        "--model", model)
        assert result.exit_code == 0, result.output
        return [(r["kernel_name"], r["bucket"]) for r in json.loads(result.stdout)]

    assert exported("qwen3-8b") == [("qk_norm", b) for b in STORED_BUCKETS]
    assert exported("llama-3.1-8b") == []


def test_export_current_keeps_only_the_winners_of_the_installed_code(stored_db, tmp_path):
    """A winner whose source hash is not the kernel's now (tuned with older code) is left out
    with --current, kept without it."""
    records = json.loads(invoke(stored_db, "export", "--format", "json", "--all-devices").stdout)
    records[0]["source_hash"] = "0123456789abcdef"
    (tmp_path / "mixed.json").write_text(json.dumps(records))
    url = f"sqlite:///{tmp_path / 'mixed.db'}"
    assert invoke(url, "import", str(tmp_path / "mixed.json")).exit_code == 0

    def buckets(*flags):
        result = invoke(url, "export", "--format", "json", "--all-devices", *flags)
        assert result.exit_code == 0, result.output
        return sorted(r["bucket"] for r in json.loads(result.stdout))

    assert buckets() == sorted(STORED_BUCKETS)
    assert buckets("--current") == sorted(set(STORED_BUCKETS) - {records[0]["bucket"]})


def test_export_of_an_unknown_model_is_one_clear_line(stored_db):
    assert_clean_error(invoke(stored_db, "export", "--format", "json", "--model", "gpt-9"),
                       "--model", "gpt-9")


def test_export_json_of_an_empty_db_is_an_empty_list(created_db):
    result = invoke(created_db, "export", "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == []


def test_export_csv_to_a_file(stored_db, tmp_path):
    out = tmp_path / "winners.csv"
    result = invoke(stored_db, "export", "--format", "csv", "--all-devices", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.stderr
    assert result.stdout == ""  # the data went to the file only
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert len(rows) == len(STORED_BUCKETS)
    assert [row["bucket"] for row in rows] == [str(b) for b in STORED_BUCKETS]
    assert {"kernel_name", "config_json", "median_us", "gpu_name"} <= set(rows[0])
    assert all(json.loads(row["config_json"])["vector_bits"] != 32 for row in rows)


def test_export_csv_of_an_empty_db_still_has_its_header(created_db, tmp_path):
    out = tmp_path / "empty.csv"
    result = invoke(created_db, "export", "--format", "csv", "--out", str(out))
    assert result.exit_code == 0, result.output
    lines = out.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kernel_name,")


def test_export_rejects_an_unknown_format(empty_db):
    assert_clean_error(invoke(empty_db, "export", "--format", "xml"), "--format", "xml")


# -- the --db option ------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["nosuchdb://x", "not a url"])
@pytest.mark.parametrize("command", [["show"], ["export", "--format", "json"]])
def test_bad_db_url_is_one_clear_line(url, command):
    assert_clean_error(invoke(url, *command), "--db", repr(url))


def test_db_path_that_cannot_be_created_is_one_clear_line_for_a_writer(tmp_path):
    from cutetune.cli.context import Context

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(click.BadParameter, match="cannot create the directory"):
        Context(f"sqlite:///{blocker / 'x.db'}").open_db(writable=True)


@pytest.mark.parametrize("command", [["show"], ["show", "--failed"],
                                     ["export", "--format", "json"]])
def test_commands_that_only_read_refuse_a_missing_database_and_create_nothing(tmp_path,
                                                                              command):
    missing = tmp_path / "folder" / "x.db"
    result = invoke(f"sqlite:///{missing}", *command)
    assert_clean_error(result, "--db", f"cannot open the database sqlite:///{missing}: "
                       "no such file (run cutetune tune first, or give --db)")
    assert not (tmp_path / "folder").exists()


def test_commands_that_only_read_change_nothing(stored_db):
    path = Path(stored_db.removeprefix("sqlite:///"))
    before = path.read_bytes()
    for command in (["show", "--all-devices"], ["show", "--failed", "--all-devices"],
                    ["export", "--format", "csv", "--all-devices"]):
        assert invoke(stored_db, *command).exit_code == 0
    assert path.read_bytes() == before


def test_a_file_that_is_no_database_is_one_clear_line(tmp_path):
    garbage = tmp_path / "x.db"
    garbage.write_bytes(b"not a database" * 100)
    assert_clean_error(invoke(f"sqlite:///{garbage}", "show"), "--db",
                       "file is not a database")


def test_a_database_without_cutetunes_tables_is_one_clear_line(tmp_path):
    import sqlite3

    foreign = tmp_path / "x.db"
    sqlite3.connect(foreign).execute("CREATE TABLE other (x)").connection.commit()
    assert_clean_error(invoke(f"sqlite:///{foreign}", "show", "--failed"),
                       "cannot read the database", "no such table")


def test_a_password_never_reaches_a_message():
    result = invoke("postgresql+nosuchdriver://tuner:s3cret@localhost/cutetune", "show")
    assert_clean_error(result, "--db", "tuner:***@localhost")
    assert "s3cret" not in result.output


def test_show_rejects_an_unknown_kernel(stored_db):
    assert_clean_error(invoke(stored_db, "show", "--kernel", "nosuch"),
                       "unknown kernel 'nosuch'", "qk_norm")


def test_export_to_a_missing_directory_is_one_clear_line(created_db, tmp_path):
    out = tmp_path / "missing" / "winners.csv"
    assert_clean_error(invoke(created_db, "export", "--format", "csv", "--out", str(out)),
                       "--out")


# -- start-up and version -------------------------------------------------------------------


def test_the_version_is_written_once_and_installed_metadata_reads_it():
    import cutetune

    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"cutetune, version {cutetune.__version__}"
    assert cutetune.__version__ == version("cutetune")


def test_a_checkout_run_from_source_knows_its_version(tmp_path):
    """Not installed (on PYTHONPATH, as on the GPU machine), the package still imports and
    says its version: nothing reads the installed metadata at import."""
    import cutetune

    script = ("import importlib.metadata as m\n"
              "def missing(name):\n"
              "    raise m.PackageNotFoundError(name)\n"
              "m.version = m.distribution = missing\n"
              "import cutetune\n"
              "from cutetune.cli.main import cli\n"
              "print(cutetune.__version__)\n")
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           check=True, cwd=tmp_path)
    assert shown.stdout.strip() == cutetune.__version__


def test_the_cli_imports_no_heavy_library_until_a_command_needs_it():
    """--help and the commands that need no kernel start fast: torch, CuTeDSL, SQLAlchemy,
    Optuna and pandas are imported by the commands that use them."""
    heavy = ("torch", "cutlass", "sqlalchemy", "optuna", "pandas")
    loaded = subprocess.run(
        [sys.executable, "-c", f"import sys, cutetune.cli.main; "
         f"print(' '.join(m for m in {heavy!r} if m in sys.modules))"],
        capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == ""


# -- malformed model configs ----------------------------------------------------------------

QWEN3_CONFIG = {"model_type": "qwen3", "hidden_size": 1024, "num_attention_heads": 16,
                "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072,
                "rms_norm_eps": 1e-6}


@pytest.mark.parametrize("verb", [["plan", "qk_norm"], ["tune"], ["tune", "rmsnorm"],
                                  ["bench", "silu_and_mul"]])
def test_every_verb_refuses_every_malformed_config_field_in_one_line(tmp_path, empty_db, verb,
                                                                    monkeypatch):
    path = tmp_path / "config.json"
    for raw, field, expected in MALFORMED:
        path.write_text(json.dumps(raw))
        result = invoke(empty_db, *verb, "--model", str(path), "--tokens", "8")
        assert_clean_error(result, "--model", f"config {path}: {field} is", expected)
    for make, fragment in BAD_MODEL_PATHS:
        result = invoke(empty_db, *verb, "--model", make(tmp_path, monkeypatch), "--tokens", "8")
        assert_clean_error(result, "--model", fragment)
    assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize(("field", "kernel"), [
    ("hidden_size", "rmsnorm"), ("q_lora_rank", "rmsnorm"), ("head_dim", "qk_norm"),
    ("num_experts", "moe_dispatch")])
@pytest.mark.parametrize("value", [2**40, 10**30])
def test_a_size_beyond_a_kernels_range_is_one_line(tmp_path, empty_db, field, kernel, value):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**BASE_OF_FIELD[field], field: value}))
    result = invoke(empty_db, "plan", kernel, "--model", str(path), "--tokens", "8")
    assert_clean_error(result, str(value))


def test_a_width_no_point_can_serve_is_one_line(tmp_path, empty_db):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**QWEN3_CONFIG, "intermediate_size": 3}))
    result = invoke(empty_db, "plan", "silu_and_mul", "--model", str(path))
    assert_clean_error(result, "no valid point for silu_and_mul")


def test_gpt_oss_activation_is_refused_by_name(tmp_path, empty_db):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**QWEN3_CONFIG, "model_type": "gpt_oss", "hidden_act": "silu",
                                "swiglu_limit": 7.0}))
    result = invoke(empty_db, "plan", "silu_and_mul", "--model", str(path))
    assert_clean_error(result, "'swiglu_oai'", "silu_and_mul computes silu")


# -- cache ------------------------------------------------------------------------------------


def kernels_used_by(model) -> set[str]:
    used = set()
    for name in kernel_names():
        try:
            get_kernel(name).problems_for_model(model, "bfloat16")
        except NotApplicableError:
            continue
        used.add(name)
    return used


def test_cache_build_fills_the_cache_for_a_model_then_ls_lists_and_clear_empties_it(
        stored_db, tmp_path, monkeypatch):
    """On a machine without a GPU: every point a warmup of Qwen3-8B would serve on the H200
    (its stored qk_norm winners, the shipped ones elsewhere, the defaults of kernels not
    tuned yet) compiled for sm_90a, for every kernel the model uses."""
    monkeypatch.setenv("CUTETUNE_CACHE_DIR", str(tmp_path))
    built = invoke(stored_db, "cache", "build", "--model", "qwen3-8b", "--jobs", "2")
    assert built.exit_code == 0, built.output
    assert "points for sm_90a: " in built.output and "0 already stored" in built.output
    listed = CliRunner().invoke(cli, ["cache", "ls"])
    rows = [line for line in listed.output.splitlines() if "sm_90a" in line]
    assert {row.split()[0] for row in rows} == kernels_used_by(load_model("qwen3-8b"))
    stored_configs = {w.config_json for w in winners(Database.open(stored_db))}
    assert all(any(c in row for row in rows) for c in stored_configs)
    rmsnorm_keys = {p.static_key() for p in get_kernel("rmsnorm").problems_for_model(
        load_model("qwen3-8b"), "bfloat16")}
    shipped_configs = {w.config_json for w in shipped_winners(FINGERPRINT)
                       if w.kernel_name == "rmsnorm" and w.static_key in rmsnorm_keys}
    assert shipped_configs and all(any(c in row for row in rows) for c in shipped_configs)
    again = invoke(stored_db, "cache", "build", "--model", "qwen3-8b", "--jobs", "2")
    assert f"{len(rows)} points for sm_90a: 0 compiled" in again.output
    # Each artifact and its manifest, the record of the runtime libraries they need, and the
    # code-hash memo where this process wrote one (it did not where an earlier test of the same
    # process had worked out the kernels' hashes already).
    stored = {path.name for path in (tmp_path / "artifacts").iterdir()}
    assert len(stored - {"code-hashes.json"}) == 2 * len(rows) + 1
    cleared = CliRunner().invoke(cli, ["cache", "clear"])
    assert f"removed {len(stored)} files" in cleared.output
    assert not any((tmp_path / "artifacts").iterdir())
    assert "0 artifacts" in CliRunner().invoke(cli, ["cache", "ls"]).output


def test_cache_build_into_an_unwritable_directory_says_so(created_db, tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("CUTETUNE_CACHE_DIR", str(blocked))
    assert_clean_error(invoke(created_db, "cache", "build", "--model", "qwen3-8b"),
                       "cannot be written")


def test_cache_build_without_a_c_compiler_says_so(created_db, tmp_path, monkeypatch):
    monkeypatch.setenv("CUTETUNE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    assert_clean_error(invoke(created_db, "cache", "build", "--model", "qwen3-8b"),
                       "no C compiler found", "install one")
    assert not (tmp_path / "cache").exists()  # checked before the cache is touched


# -- import -----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_an_export_imports_into_another_database_as_the_same_winners(stored_db, tmp_path, fmt):
    exported = tmp_path / f"winners.{fmt}"
    assert invoke(stored_db, "export", "--format", fmt, "--out", str(exported)).exit_code == 0
    target = f"sqlite:///{tmp_path / 'target.db'}"
    result = invoke(target, "import", str(exported))
    assert result.exit_code == 0, result.output
    before = winners_with_devices(Database.open(stored_db))
    after = winners_with_devices(Database.open(target))
    assert f"imported {len(before)} winners" in result.output

    # Every field, the time of measurement (updated_at) included.
    assert after == before
    # Imported again: the same measurements of the same points, so nothing changes.
    assert invoke(target, "import", str(exported)).exit_code == 0
    assert winners_with_devices(Database.open(target)) == before


def test_a_bad_import_file_is_one_line_and_writes_nothing(stored_db, tmp_path):
    exported = tmp_path / "winners.json"
    invoke(stored_db, "export", "--format", "json", "--out", str(exported))
    records = json.loads(exported.read_text())
    del records[-1]["median_us"]
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(records))
    target = f"sqlite:///{tmp_path / 'target.db'}"
    result = invoke(target, "import", str(broken))
    assert_clean_error(result, f"1 of {len(records)} rows refused", "nothing imported")
    assert f"{broken}: row {len(records)}: median_us: missing" in result.stderr
    assert not (tmp_path / "target.db").exists()
    garbage = tmp_path / "garbage.txt"
    garbage.write_text("x")
    assert_clean_error(invoke(target, "import", str(garbage)), "--format")
    assert_clean_error(invoke(target, "import", str(garbage), "--format", "csv"),
                       "missing the columns")
