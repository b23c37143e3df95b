"""The report's frames and tables, read from the committed H200 results (tests/data) and from
copies of them made into test inputs (h200_results)."""

from __future__ import annotations

import dataclasses
import sqlite3

import pandas as pd
import pytest

from cutetune.report import data as report_data
from cutetune.report.data import load_report_data, model_problems
from cutetune.report.markdown import render_markdown
from cutetune.report.tables import (
    SECTIONS,
    coverage,
    environment,
    failures,
    roofline,
    search,
    speedups,
    winner_configs,
)
from cutetune.results_db import Database, record_ceilings, winners_with_devices
from cutetune.serving.plan import DEFAULT, NEAREST, SHIPPED, TUNED
from cutetune.spaces.models import UnknownModelError
from testkit.h200_results import (
    AWAITING_H200_TUNE,
    BENCH_TOKENS,
    BENCH_US,
    FAILURES,
    H200_URL,
    add_bench_and_failures,
    current_copy,
)


@pytest.fixture(scope="module")
def h200_url(tmp_path_factory) -> str:
    """The H200 results, re-keyed to the current kernel sources, with synthetic bench rows
    and failed trials."""
    url = current_copy(tmp_path_factory.mktemp("h200"))
    add_bench_and_failures(url)
    return url


def test_the_committed_results_as_stored(h200_url):
    data = load_report_data(H200_URL, "qwen3-8b")
    assert data.device.gpu_name == "NVIDIA H200"
    assert data.ceilings == pytest.approx({"copy_gbps": 4152.26, "launch_floor_us": 0.5828},
                                          rel=1e-4)
    assert len(data.winners) == 64 and len(data.trials) == 1024 and data.bench.empty
    # Only the model's problems: qwen3-30b-a3b's MoE rows are in the file too.
    assert set(data.trials["kernel_name"]) == {"qk_norm", "rmsnorm", "silu_and_mul"}
    table = winner_configs(data).set_index(["problem", "row"])
    assert table.loc[("qk_norm", "median us"), 1] == pytest.approx(1.3144, rel=1e-4)
    assert table.loc[("qk_norm", "warps_per_block"), 1] == 8
    assert table.loc[("qk_norm", "vector_bits"), 1] == 64
    # Knobs of other kernels are not rows of qk_norm's.
    assert ("qk_norm", "cache_hints") not in table.index


def _tuned_kernels(frame: pd.DataFrame) -> pd.DataFrame:
    """The coverage rows of the kernels the committed results hold (the others await their H200
    tune and are served the default)."""
    awaiting = frame["kernel_name"].isin(list(AWAITING_H200_TUNE))
    assert set(frame.loc[awaiting, "source"]) <= {DEFAULT}
    return frame[~awaiting]


def test_coverage_is_the_dispatchers_plan(tmp_path, monkeypatch):
    url = current_copy(tmp_path)
    data = load_report_data(url, "qwen3-8b")
    assert set(_tuned_kernels(data.coverage)["source"]) == {TUNED}
    assert (coverage(data)["stale_winners"] == 0).all()
    # Without the winners above 64 tokens, those buckets are served by the package's shipped
    # winners; without those too, by bucket 64's winner where it is a valid point there, else
    # by the default.
    path = url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as connection:
        connection.execute("DELETE FROM winners WHERE bucket > 64")
    connection.close()
    data = load_report_data(url, "qwen3-8b")
    served = _tuned_kernels(data.coverage)
    assert set(served.loc[served["bucket"] > 64, "source"]) <= {SHIPPED, NEAREST}
    assert coverage(data).loc["qk_norm", 128] == "S"
    monkeypatch.setattr(report_data, "shipped_winners", lambda fingerprint: [])
    data = load_report_data(url, "qwen3-8b")
    served = _tuned_kernels(data.coverage)
    above = served[served["bucket"] > 64]
    assert set(above["source"]) <= {NEAREST, DEFAULT} and NEAREST in set(above["source"])
    assert set(above.loc[above["source"] == NEAREST, "tuned_bucket"]) == {64}
    assert set(served.loc[served["bucket"] <= 64, "source"]) == {TUNED}
    assert coverage(data).loc["qk_norm", 128] in ("N64", "D")


def test_winners_of_an_older_source_are_counted_not_served():
    data = load_report_data(H200_URL, "qwen3-8b")
    stale = int((~data.winners["current_source"]).sum())
    table = coverage(data)
    assert table["stale_winners"].sum() == stale
    tuned_cells = (table.drop(columns="stale_winners") == "T").to_numpy().sum()
    assert tuned_cells == 64 - stale


def test_bench_sections(h200_url):
    data = load_report_data(h200_url, "qwen3-8b")
    table = speedups(data)
    assert len(table) == len(model_problems("qwen3-8b")) * len(BENCH_TOKENS)
    assert set(table["best_peer"]) == {"liger"}
    assert table["over_default"].to_numpy() == pytest.approx(BENCH_US["cutetune default"])
    assert table["over_best_peer"].to_numpy() == pytest.approx(BENCH_US["liger"])


def test_search_marks_exhaustive_runs():
    table = search(load_report_data(H200_URL, "qwen3-30b-a3b")).set_index("problem")
    # moe_combine's space is small enough for a 16-trial budget to try all of it at every
    # bucket; qk_norm's is not (and qwen3-30b-a3b's qk_norm is not in the file).
    assert table.loc["moe_combine", "exhaustive"] == table.loc["moe_combine", "studies"] == 16
    qwen3_8b = search(load_report_data(H200_URL, "qwen3-8b")).set_index("problem")
    assert qwen3_8b.loc["qk_norm", "exhaustive"] == 0
    assert (qwen3_8b["best/final after 8"] >= 1.0).all()


def test_roofline_and_failures(h200_url):
    data = load_report_data(h200_url, "qwen3-8b")
    table = roofline(data).set_index("kernel")
    measured = data.trials[data.trials["status"] == "ok"]
    assert table.loc["all", "trials"] == len(measured) == 1024
    ratio = measured["median_us"] / measured["predicted_us"]
    assert table.loc["all", "median measured/predicted"] == pytest.approx(ratio.median())
    counts = failures(data).set_index("reason")["trials"]
    expected = pd.Series([reason.split(":")[0] for reason in FAILURES]).value_counts()
    assert counts.to_dict() == expected.to_dict() == {"crash": 2, "hang": 1}


def test_markdown_has_every_section_and_says_what_is_missing(tmp_path):
    text = render_markdown(load_report_data(H200_URL, "qwen3-8b"))
    for section in SECTIONS:
        assert f"## {section.title}" in text
    assert "| qk_norm | median us | 1.314 | 1.342 |" in text
    assert "No bench rows for this model and device" in text
    empty_url = f"sqlite:///{tmp_path / 'empty.db'}"
    Database.open(empty_url).dispose()
    empty = render_markdown(load_report_data(empty_url, "qwen3-8b"))
    assert "Nothing is tuned for qwen3-8b in this database" in empty
    assert all(section.empty in empty for section in SECTIONS)


def test_bad_model_and_device():
    with pytest.raises(UnknownModelError, match="unknown model 'nope'"):
        load_report_data(H200_URL, "nope")
    with pytest.raises(ValueError, match="no device in the database is named like 'B200'"):
        load_report_data(H200_URL, "qwen3-8b", device="B200")
    assert load_report_data(H200_URL, "qwen3-8b", device="h200").device is not None


def test_a_model_with_nothing_tuned():
    data = load_report_data(H200_URL, "llama-3.1-70b")
    assert data.winners.empty and data.trials.empty
    # The other models' winners on this device lend theirs where valid (serving/plan.py).
    assert "borrowed" in set(data.coverage["source"]) <= {DEFAULT, "shipped", "borrowed"}
    assert "B" in set(coverage(data).drop(columns="stale_winners").to_numpy().ravel())
    assert "Nothing is tuned for llama-3.1-70b" in data.summary()
    assert isinstance(coverage(data), pd.DataFrame)


def test_the_device_with_the_most_winners_unless_one_is_named(tmp_path):
    url = current_copy(tmp_path)
    db = Database.open(url)
    h200 = winners_with_devices(db)[0][0]
    h100 = dataclasses.replace(h200, gpu_name="NVIDIA H100 80GB HBM3")
    record_ceilings(db, h100, {"copy_gbps": 3000.0})  # stored after the H200: a later id
    db.dispose()
    assert load_report_data(url, "qwen3-8b").device == h200
    named = load_report_data(url, "qwen3-8b", device="H100")
    assert named.device == h100 and named.ceilings["copy_gbps"] == 3000.0
    assert named.winners.empty and "Nothing is tuned for qwen3-8b" in named.summary()
    assert environment(named).set_index("gpu_name")["reported"].to_dict() == {
        h200.gpu_name: False, h100.gpu_name: True}


def test_a_calibration_shows_beside_the_datasheet_and_serves_what_nothing_tuned(
        tmp_path_factory):
    from cutetune.serving.plan import PREDICTED
    from cutetune.tuner.calibrate import calibrate

    url = current_copy(tmp_path_factory.mktemp("calibrated"))
    db = Database.open(url)
    (done,) = calibrate(db)
    db.dispose()
    assert done.model is not None, done.refused
    data = load_report_data(url, "qwen3-8b")
    table = roofline(data).set_index("kernel")
    measured = data.trials[data.trials["status"] == "ok"]
    error = ((measured["median_us"] / measured["calibrated_us"]) - 1).abs() * 100
    assert table.loc["all", "calibrated: median error %"] == pytest.approx(error.median())
    # Fitted to these very trials, it predicts them better than the datasheet does.
    assert table.loc["all", "calibrated: median error %"] < table.loc["all", "median error %"]
    assert "calibrated: median error %" not in roofline(load_report_data(H200_URL, "qwen3-8b"))
    # What no winner covers is the calibrated model's pick now, not the heuristic's.
    sources = set(data.coverage["source"])
    assert DEFAULT not in sources and (PREDICTED in sources or sources <= {TUNED, NEAREST})
