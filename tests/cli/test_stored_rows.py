"""`report` and `cache build` on a database holding stored winners today's kernels cannot use
(written past the import's checks, as an older cutetune could have): no traceback, one line per
row skipped, and the usable winners still served."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from cutetune.cli.main import cli
from cutetune.device.specs import device_spec_for
from cutetune.results_db import Database
from cutetune.results_db.export import check_import
from cutetune.results_db.queries import record_tuning_results
from cutetune.spaces.space import config_to_json
from testkit.bad_imports import SMALL, UNUSABLE_REASONS, VALID, unusable_runs, valid_records


@pytest.fixture
def unusable_db(tmp_path: Path) -> str:
    """The valid rows of bad_imports (qk_norm of Qwen3-8B at 8 and 4096 tokens on the H200)
    and its unusable ones (at 3, 16 and 32)."""
    url = f"sqlite:///{tmp_path / 'stored.db'}"
    db = Database.open(url)
    checked = check_import(json.dumps(valid_records()), "json", device_spec_for)
    record_tuning_results(db, [*checked.runs, *unusable_runs()])
    db.dispose()
    return url


def skipped_lines(caplog, wording: str) -> dict[int, list[str]]:
    """The cutetune log lines with `wording`, by the unusable bucket each names."""
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("cutetune")]
    return {bucket: [line for line in lines
                     if wording in line and re.search(rf"bucket {bucket}\b", line)]
            for bucket in UNUSABLE_REASONS}


def test_report_leaves_out_each_unusable_winner_in_one_line(unusable_db, caplog):
    with caplog.at_level(logging.WARNING, logger="cutetune"):
        result = CliRunner().invoke(cli, ["--db", unusable_db, "report", "--model", "qwen3-8b",
                                          "--format", "md"])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    for bucket, lines in skipped_lines(caplog, "leaves out the stored winner").items():
        assert len(lines) == 1, (bucket, lines)
        assert UNUSABLE_REASONS[bucket] in lines[0] and "qk_norm" in lines[0]
    # The trials of bucket 3 (no bucket of the policy) cannot be planned either.
    (trials,) = skipped_lines(caplog, "leaves out the 1 stored trials")[3]
    assert "bucket: 3 is not a power of two" in trials
    # The usable winners are still what serves their buckets.
    coverage = result.stdout.split("## Coverage")[1]
    header = next(line for line in coverage.splitlines() if line.startswith("| problem |"))
    row = next(line for line in coverage.splitlines() if line.startswith("| qk_norm |"))
    cells = dict(zip(header.split("|"), row.split("|"), strict=True))
    assert [cells[f" {bucket} "].strip() for bucket, _ in VALID] == ["T", "T"]
    # The plan's rejections are listed in their own table, each with the constraint's reason,
    # and appear nowhere else.
    before, rejected = result.stdout.split("## Coverage: stored winners the plan rejects")
    rejected, after = rejected.split("\n## ", 1)
    for bucket, reason in UNUSABLE_REASONS.items():
        field, why = reason.split(": ", 1)
        assert any(line.startswith(f"| qk_norm | {bucket} | tuned |")
                   and f"| {field} | {why}" in line for line in rejected.splitlines())
    rest = before + after
    assert "vector_bits | 7" not in rest and "policy" not in rest


def test_cache_build_skips_each_unusable_winner_in_one_line(unusable_db, tmp_path, caplog,
                                                            monkeypatch):
    """The points a warmup would serve are compiled (here recorded, not compiled): the usable
    winners', never an unusable one's."""
    from cutetune.build.artifacts import ArtifactStore

    compiled = []
    monkeypatch.setattr(ArtifactStore, "compile", lambda store, kernel, problem, config:
                        compiled.append((kernel.name, config_to_json(config))))
    monkeypatch.setenv("CUTETUNE_CACHE_DIR", str(tmp_path / "cache"))
    with caplog.at_level(logging.WARNING, logger="cutetune"):
        result = CliRunner().invoke(cli, ["--db", unusable_db, "cache", "build", "--model",
                                          "qwen3-8b", "--jobs", "1"])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    for bucket, lines in skipped_lines(caplog, "skipping a stored qk_norm winner").items():
        assert len(lines) == 1, (bucket, lines)
        assert UNUSABLE_REASONS[bucket] in lines[0]
    qk_norm = {config for name, config in compiled if name == "qk_norm"}
    assert {config_to_json(config) for _, config in VALID} <= qk_norm
    assert not any('"vector_bits": 7' in c or "policy" in c for c in qk_norm)
    assert config_to_json(SMALL) in qk_norm
