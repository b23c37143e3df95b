"""Recording tuning results, ceilings and benchmarks, and reading them back."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

import cutetune.results_db.queries as queries
from cutetune.results_db import (
    BenchRecord,
    Winner,
    bench_frame,
    devices_frame,
    latest_ceilings,
    record_bench,
    record_ceilings,
    record_tuning_result,
    trials_frame,
    winners,
    winners_frame,
    winners_to_serve,
    winners_with_devices,
)
from cutetune.results_db.schema import Base, BenchRow, DeviceRow, TrialRow, TuningRunRow, WinnerRow


def row_counts(db) -> dict[str, int]:
    with db.session() as session:
        return {
            table.name: session.scalar(select(func.count()).select_from(table))
            for table in Base.metadata.sorted_tables
        }


def warps(winner: Winner) -> int:
    return json.loads(winner.config_json)["warps_per_block"]


def test_tuning_result_round_trip(db, h200, make_result):
    result = make_result(median_us=2.0, warps=4)
    record_tuning_result(db, h200, result)

    [winner] = winners(db, h200)
    best = result.trials[0]
    assert winner == Winner(
        kernel_name="qk_norm",
        source_hash="5f1e0c",
        static_key=result.static_key,
        bucket=16,
        config_json=best.config_json,
        median_us=best.median_us,
        iqr_us=best.iqr_us,
        gbps=best.gbps,
        pct_roofline=best.pct_roofline,
        updated_at=winner.updated_at,
    )
    # The winner's time is when it was measured (its run's end), not when it was written.
    assert winner.updated_at == result.finished_at

    frame = trials_frame(db)
    assert list(frame["number"]) == [0, 1, 2]
    assert list(frame["status"]) == ["ok", "ok", "failed"]
    assert set(frame["kernel_name"]) == {"qk_norm"}
    assert set(frame["static_key"]) == {result.static_key}
    assert set(frame["bucket"]) == {16}
    assert set(frame["gpu_name"]) == {"NVIDIA H200"}
    assert list(frame["config_json"]) == [t.config_json for t in result.trials]
    assert list(frame["median_us"][:2]) == [2.0, 6.0]
    assert frame["median_us"].isna()[2]
    assert frame["failure_reason"][2] == "max abs error 0.5 > tolerance 0.02"
    assert list(frame["predicted_us"][:2]) == [pytest.approx(1.8), pytest.approx(5.4)]

    with db.session() as session:
        run = session.scalars(select(TuningRunRow)).one()
        assert (run.started_at, run.finished_at) == (result.started_at, result.finished_at)
        assert run.study_name == "qk_norm-16"


def test_winner_points_at_its_trial_and_run(db, h200, make_result):
    record_tuning_result(db, h200, make_result(median_us=2.0, warps=4))
    record_tuning_result(db, h200, make_result(median_us=1.0, warps=8))
    with db.session() as session:
        winner = session.scalars(select(WinnerRow)).one()
        trial = session.get(TrialRow, winner.trial_id)
        latest_run = session.scalar(select(func.max(TuningRunRow.id)))
        assert (trial.run_id, trial.number, trial.median_us) == (latest_run, 0, 1.0)
        assert winner.run_id == latest_run
        assert trial.config_json == winner.config_json


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        pytest.param((2.0, 4), (1.5, 8), (1.5, 8), id="faster-replaces"),
        pytest.param((2.0, 4), (3.0, 8), (2.0, 4), id="slower-keeps"),
        pytest.param((2.0, 4), (2.0, 8), (2.0, 4), id="tie-keeps"),
        pytest.param((2.0, 4), (2.5, 4), (2.5, 4), id="same-config-slower-replaces"),
        pytest.param((2.0, 4), (1.8, 4), (1.8, 4), id="same-config-faster-replaces"),
    ],
)
def test_winner_upsert_rule(db, h200, make_result, first, second, expected):
    for median_us, warps_per_block in (first, second):
        record_tuning_result(db, h200, make_result(median_us=median_us, warps=warps_per_block))
    [winner] = winners(db, h200)
    assert (winner.median_us, warps(winner)) == expected
    # Both runs are kept whichever wins.
    assert row_counts(db)["tuning_runs"] == 2


def test_fingerprints_isolate_winners(db, h200, h100, make_result):
    record_tuning_result(db, h200, make_result(median_us=2.0, warps=4))
    record_tuning_result(db, h100, make_result(median_us=3.0, warps=8))

    assert [(w.median_us, warps(w)) for w in winners(db, h200)] == [(2.0, 4)]
    assert [(w.median_us, warps(w)) for w in winners(db, h100)] == [(3.0, 8)]
    assert [(d, w.median_us) for d, w in winners_with_devices(db)] == [(h200, 2.0), (h100, 3.0)]
    assert len(winners(db)) == 2
    # A driver update is another environment: nothing measured under the old one is served.
    assert winners(db, dataclasses.replace(h200, driver="575.51")) == []


def test_a_new_kernel_source_does_not_compete_with_the_old(db, h200, make_result):
    record_tuning_result(db, h200, make_result(median_us=1.0, source_hash="old"))
    record_tuning_result(db, h200, make_result(median_us=2.0, source_hash="new"))
    assert [(w.source_hash, w.median_us) for w in winners(db, h200)] == [("new", 2.0), ("old", 1.0)]


def test_buckets_and_problems_have_their_own_winners(db, h200, make_result):
    record_tuning_result(db, h200, make_result(median_us=1.0, bucket=1))
    record_tuning_result(db, h200, make_result(median_us=9.0, bucket=512))
    other_problem = json.dumps({"dtype": "float16", "eps": 1e-6, "head_dim": 64}, sort_keys=True)
    record_tuning_result(db, h200, make_result(median_us=5.0, static_key=other_problem))
    assert sorted(
        (w.static_key == other_problem, w.bucket, w.median_us) for w in winners(db, h200)
    ) == [(False, 1, 1.0), (False, 512, 9.0), (True, 16, 5.0)]


def test_kernel_name_filter(db, h200, make_result):
    record_tuning_result(db, h200, make_result(kernel_name="qk_norm"))
    record_tuning_result(db, h200, make_result(kernel_name="rms_norm"))
    assert [w.kernel_name for w in winners(db, kernel_name="rms_norm")] == ["rms_norm"]
    assert set(trials_frame(db, kernel_name="rms_norm")["kernel_name"]) == {"rms_norm"}
    assert len(trials_frame(db)) == 6


def test_a_run_without_winner_keeps_its_trials(db, h200, make_result, failed_trial):
    result = dataclasses.replace(
        make_result(),
        trials=(failed_trial(0, 4, "ptxas: too many registers"), failed_trial(1, 8, "hang")),
        winner_number=None,
    )
    record_tuning_result(db, h200, result)
    assert winners(db) == []
    counts = row_counts(db)
    assert (counts["tuning_runs"], counts["tuning_trials"], counts["winners"]) == (1, 2, 0)


@pytest.mark.parametrize("device", ["h200", "h100"])
def test_an_interrupted_write_leaves_nothing(db, h200, make_result, monkeypatch, request, device):
    record_tuning_result(db, h200, make_result(median_us=2.0, warps=4))
    counts_before = row_counts(db)
    winners_before = winners(db)

    def fail(*args, **kwargs):
        raise RuntimeError("connection lost")

    # The winner is written last, after the device, kernel, problem, run and trials.
    monkeypatch.setattr(queries, "_upsert_winner", fail)
    with pytest.raises(RuntimeError, match="connection lost"):
        record_tuning_result(
            db, request.getfixturevalue(device), make_result(median_us=1.0, warps=8)
        )

    assert row_counts(db) == counts_before
    assert counts_before["tuning_runs"] == 1
    assert winners(db) == winners_before


def test_ceilings_keep_the_latest_value_per_name(db, h200, h100):
    record_ceilings(db, h200, {"copy_gbps": 4000.0, "launch_floor_us": 0.6})
    record_ceilings(db, h200, {"copy_gbps": 4200.0})
    record_ceilings(db, h100, {"copy_gbps": 3000.0})
    assert latest_ceilings(db, h200) == {"copy_gbps": 4200.0, "launch_floor_us": 0.6}
    assert latest_ceilings(db, h100) == {"copy_gbps": 3000.0}
    assert latest_ceilings(db, dataclasses.replace(h200, gpu_name="NVIDIA B200")) == {}
    assert row_counts(db)["ceilings"] == 4


def bench(implementation: str, median_us: float | None) -> BenchRecord:
    return BenchRecord(
        kernel_name="rms_norm",
        static_key='{"hidden": 4096}',
        num_tokens=32768,
        implementation=implementation,
        median_us=median_us,
        gbps=None if median_us is None else 2 * 32768 * 4096 * 2 / median_us / 1e3,
        pct_of_copy=None,
    )


def test_bench_rows_round_trip(db, h200):
    record_bench(db, h200, [bench("cutetune", 130.0), bench("liger", 131.0)])
    with db.session() as session:
        rows = session.execute(
            select(BenchRow, DeviceRow.gpu_name).join(DeviceRow).order_by(BenchRow.median_us)
        ).all()
        assert [(row.implementation, row.median_us, gpu) for row, gpu in rows] == [
            ("cutetune", 130.0, "NVIDIA H200"),
            ("liger", 131.0, "NVIDIA H200"),
        ]
        assert rows[0][0].gbps == pytest.approx(4129.6, rel=1e-3)
        assert rows[0][0].measured_at.tzinfo == UTC


def test_bench_is_all_or_nothing(db, h200):
    with pytest.raises(IntegrityError):
        record_bench(db, h200, [bench("cutetune", 130.0), bench("broken", None)])
    counts = row_counts(db)
    assert (counts["bench_results"], counts["devices"]) == (0, 0)


def test_winners_frame_names_the_gpu(db, h200, h100, make_result):
    record_tuning_result(db, h200, make_result(median_us=2.0))
    record_tuning_result(db, h100, make_result(median_us=3.0))
    frame = winners_frame(db)
    assert list(frame.columns) == [f.name for f in dataclasses.fields(Winner)] + ["gpu_name"]
    assert list(zip(frame["gpu_name"], frame["median_us"], strict=True)) == [
        ("NVIDIA H200", 2.0),
        ("NVIDIA H100 80GB HBM3", 3.0),
    ]
    assert list(winners_frame(db, h100)["gpu_name"]) == ["NVIDIA H100 80GB HBM3"]


def test_empty_frames_still_have_their_columns(db):
    trials = trials_frame(db)
    assert len(trials) == 0
    assert {"kernel_name", "static_key", "bucket", "gpu_name", "status", "median_us"} <= set(
        trials.columns
    )
    assert len(winners_frame(db).columns) == len(dataclasses.fields(Winner)) + 1


def test_the_fingerprint_policy_serves_across_driver_cuda_and_torch_and_says_so(
        db, h200, h100, make_result):
    """Must match: GPU model, compute capability, SM count, CuTeDSL. May differ (served, the
    difference named): driver, CUDA runtime, torch."""
    patched = dataclasses.replace(h200, driver="575.51", torch="2.9.1")
    record_tuning_result(db, patched, make_result(median_us=2.0, warps=4, bucket=8))
    record_tuning_result(db, h200, make_result(median_us=3.0, warps=8, bucket=64))
    record_tuning_result(db, patched, make_result(median_us=1.0, warps=2, bucket=64))
    for other in (h100, dataclasses.replace(h200, sm_count=114),
                  dataclasses.replace(h200, compute_capability="9.1"),
                  dataclasses.replace(h200, cutlass_dsl="4.9.0")):
        record_tuning_result(db, other, make_result(median_us=0.5, warps=1, bucket=8))

    served = {w.bucket: w for w in winners_to_serve(db, h200)}
    assert set(served) == {8, 64}
    # Bucket 8: only the patched environment measured it; served, and the report can say how.
    assert warps(served[8]) == 4
    assert served[8].measured_elsewhere == "driver 575.51 (here 570.133), torch 2.9.1 (here 2.9.0)"
    # Bucket 64: this environment's own winner goes before a faster one measured elsewhere.
    assert (warps(served[64]), served[64].measured_elsewhere) == (8, "")
    # Where nothing was measured here, one of the others, saying where it was measured.
    (elsewhere,) = [w for w in winners_to_serve(db, dataclasses.replace(h200, torch="2.10"))
                    if w.bucket == 64]
    assert "torch" in elsewhere.measured_elsewhere and "(here 2.10)" in elsewhere.measured_elsewhere


def test_trials_frame_of_one_device(db, h200, h100, make_result):
    record_tuning_result(db, h200, make_result())
    record_tuning_result(db, h100, make_result())
    assert set(trials_frame(db, fingerprint=h100)["gpu_name"]) == {h100.gpu_name}
    assert len(trials_frame(db, fingerprint=h100)) * 2 == len(trials_frame(db))


def test_bench_frame_and_devices_frame(db, h200, h100):
    record_bench(db, h200, [BenchRecord("rms_norm", "{}", 8, "cutetune tuned", 2.0, 1.0, 50.0)])
    record_ceilings(db, h200, {"copy_gbps": 4000.0})
    record_ceilings(db, h200, {"copy_gbps": 4200.0, "launch_floor_us": 0.55})
    record_ceilings(db, h100, {"launch_floor_us": 0.6})
    bench = bench_frame(db)
    assert list(bench["implementation"]) == ["cutetune tuned"]
    assert list(bench["gpu_name"]) == [h200.gpu_name]
    assert bench_frame(db, h100).empty
    devices = devices_frame(db).set_index("gpu_name")
    assert devices.loc[h200.gpu_name, "copy_gbps"] == 4200.0  # the latest value
    assert devices.loc[h200.gpu_name, "launch_floor_us"] == 0.55
    assert devices.loc[h100.gpu_name, "launch_floor_us"] == 0.6
    assert devices["copy_gbps"].isna().sum() == 1  # never measured on the H100
