"""benchmarks/eta_replay.py: the ETA of real runs, recorded by `tune_eta` on an H100 (a Kimi-K2
config at 1, 64 and 4096 tokens, commit 6c12bd4) and on an H200 (the same, commit 8928b03;
tests/data/eta), played again through the current tuner/eta.py on the CPU."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

from benchmarks import eta_replay

DATA = Path(__file__).parents[1] / "data"
MODEL = str(DATA / "hf_configs" / "Kimi-K2-Instruct.json")
READINGS = DATA / "eta" / "kimi-k2-h100-readings.csv"
COMPILES = DATA / "eta" / "kimi-k2-h100-compiles.csv"


def read(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def planned():
    return eta_replay.planned_run(MODEL, [1, 64, 4096], "H100 SXM")


def test_the_recorded_h100_run_replays_within_30_percent_from_5_percent(planned):
    replayed = eta_replay.replay(*planned, read(READINGS), read(COMPILES), processes=12)
    assert len(replayed) == 1010
    for reading in eta_replay.at_shares(replayed):
        assert abs(reading.error) < eta_replay.BAND, reading
    # The run's own ETA read +31% at 5%: each bucket's first trial was learnt as every trial's.
    assert eta_replay.at_shares(replayed)[0].recorded_eta_s > 1.3 * 212
    assert len(eta_replay.outside_band(replayed)) <= 0.02 * len(replayed)


def test_the_recorded_h200_run_replays_within_30_percent_from_5_percent():
    planned = eta_replay.planned_run(MODEL, [1, 64, 4096], "H200")
    replayed = eta_replay.replay(*planned, read(DATA / "eta" / "kimi-k2-h200-readings.csv"),
                                 read(DATA / "eta" / "kimi-k2-h200-compiles.csv"), processes=12)
    assert len(replayed) == 1014
    for reading in eta_replay.at_shares(replayed):
        assert abs(reading.error) < eta_replay.BAND, reading
    assert eta_replay.outside_band(replayed) == []


def test_a_reading_of_a_bucket_the_plan_lacks_is_refused(planned):
    readings = read(READINGS)[:3]
    readings[2] = {**readings[2], "bucket": "8"}
    with pytest.raises(SystemExit, match="reading 3's bucket .* is not one this plan has"):
        eta_replay.replay(*planned, readings, [], processes=12)


def test_readings_without_the_bucket_columns_are_refused(tmp_path, monkeypatch, capsys):
    old = tmp_path / "old-readings.csv"
    rows = read(READINGS)[:2]
    columns = [c for c in rows[0] if c not in ("problem", "bucket")]
    with open(old, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    monkeypatch.setattr(sys, "argv", [
        "eta_replay", "--model", MODEL, "--tokens", "1,64,4096", "--device", "H100 SXM",
        "--readings", str(old), "--compiles", str(COMPILES)])
    with pytest.raises(SystemExit, match="has no bucket columns: it was recorded by a tune_eta"):
        eta_replay.main()
