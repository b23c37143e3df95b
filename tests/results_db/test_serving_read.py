"""A warmup reads the winners it serves with winners_to_serve_at (issue 38 item 5): a SQLite file
with sqlite3 alone, in one query and without importing SQLAlchemy, giving what
queries.winners_to_serve gives, in its order; a missing file holds none and is not created;
anything sqlite3 cannot read as a results database goes through SQLAlchemy as before."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from cutetune.results_db import (
    Database,
    record_tuning_result,
    winners_to_serve,
    winners_to_serve_at,
    winners_with_devices,
)
from cutetune.results_db.serving_read import _sqlite_file, _winners
from testkit.child_process import child_env

RMSNORM_4096 = json.dumps({"dtype": "bfloat16", "eps": 1e-6, "hidden": 4096}, sort_keys=True)


@pytest.fixture
def stored(tmp_path, make_result, h200, h100) -> str:
    """The URL of a SQLite file holding winners of two kernels, of this environment and of
    another torch, of another GPU, and of an older kernel source."""
    url = f"sqlite:///{tmp_path / 'results.db'}"
    db = Database.open(url)
    other_torch = dataclasses.replace(h200, torch="2.9.1")
    for device, result in [
        (h200, make_result(bucket=16)),
        (h200, make_result(bucket=64, warps=8, median_us=3.0)),
        (other_torch, make_result(bucket=16, warps=2, median_us=1.0)),
        (other_torch, make_result(bucket=256)),
        (h100, make_result(bucket=16, warps=16)),
        (h200, make_result(kernel_name="rmsnorm", static_key=RMSNORM_4096, bucket=8)),
        (h200, make_result(source_hash="0ld", bucket=16)),
    ]:
        record_tuning_result(db, device, result)
    db.dispose()
    return url


def test_a_sqlite_file_reads_as_sqlalchemy_reads_it(stored, tmp_path, h200, h100):
    db = Database.open(stored)
    try:
        connection = sqlite3.connect(tmp_path / "results.db")
        try:
            assert _winners(connection) == winners_with_devices(db)
        finally:
            connection.close()
        for here in (h200, h100):
            assert winners_to_serve_at(stored, here) == winners_to_serve(db, here)
    finally:
        db.dispose()
    served = winners_to_serve_at(stored, h200)
    assert len(served) == 5  # one per kernel source, problem and bucket; none of the H100's
    assert [w.measured_elsewhere for w in served if w.bucket == 256] == [
        "torch 2.9.1 (here 2.9.0)"]


def test_reading_a_sqlite_file_imports_no_sqlalchemy(stored, h200):
    script = ("import json, sys\n"
              "from cutetune.results_db import DeviceFingerprint, winners_to_serve_at\n"
              "here = DeviceFingerprint(**json.loads(sys.argv[2]))\n"
              "print(len(winners_to_serve_at(sys.argv[1], here)),\n"
              "      sorted({m.split('.')[0] for m in sys.modules} & {'sqlalchemy', 'optuna'}))\n")
    done = subprocess.run([sys.executable, "-c", script, stored,
                           json.dumps(dataclasses.asdict(h200))],
                          capture_output=True, text=True, env=child_env(), check=True)
    assert done.stdout.split(maxsplit=1) == ["5", "[]\n"]


def test_a_missing_file_holds_no_winners_and_is_not_created(tmp_path, h200):
    path = tmp_path / "nowhere" / "results.db"
    assert winners_to_serve_at(f"sqlite:///{path}", h200) == []
    assert not path.parent.exists()


def test_a_file_without_the_tables_goes_through_sqlalchemy_which_creates_them(tmp_path, h200):
    path = tmp_path / "empty.db"
    path.touch()
    assert winners_to_serve_at(f"sqlite:///{path}", h200) == []
    with sqlite3.connect(path) as connection:
        tables = {row[0] for row in connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"winners", "kernels", "problems", "devices"} <= tables


@pytest.mark.parametrize(("url", "path"), [
    ("sqlite:///results.db", Path("results.db")),
    ("sqlite:////tmp/results.db", Path("/tmp/results.db")),
    ("sqlite:///~/results.db", Path("~/results.db").expanduser()),
    # SQLAlchemy's reading of these URLs is not a plain path: they go through it.
    ("sqlite://", None),
    ("sqlite:///:memory:", None),
    ("sqlite:///file:results.db?mode=ro&uri=true", None),
    ("sqlite:///results.db?timeout=5", None),
    ("sqlite:///my%20results.db", None),
    ("sqlite+pysqlite:///results.db", None),
    ("postgresql://user@host/cutetune", None),
])
def test_only_a_plain_sqlite_path_is_read_without_sqlalchemy(url, path):
    assert _sqlite_file(url) == path
