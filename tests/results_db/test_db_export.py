"""Exporting winners as JSON and CSV, parsed back."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from datetime import datetime

import pytest

from cutetune.results_db import Winner, export_winners, record_tuning_result, winners

FINGERPRINT_FIELDS = [
    "gpu_name",
    "compute_capability",
    "sm_count",
    "driver",
    "cuda",
    "torch",
    "cutlass_dsl",
]


@pytest.fixture
def tuned(db, h200, h100, make_result):
    record_tuning_result(db, h200, make_result(median_us=2.0, warps=4))
    record_tuning_result(db, h100, make_result(median_us=3.0, warps=8))
    return db


def test_json_export(tuned, h200):
    objects = json.loads(export_winners(tuned, "json"))
    assert [(o["gpu_name"], o["median_us"]) for o in objects] == [
        ("NVIDIA H200", 2.0),
        ("NVIDIA H100 80GB HBM3", 3.0),
    ]
    first = objects[0]
    assert list(first) == sorted(first)
    assert first["config"] == {"vector_width": 8, "warps_per_block": 4}
    assert "config_json" not in first
    assert {k: first[k] for k in FINGERPRINT_FIELDS} == dataclasses.asdict(h200)
    [stored] = winners(tuned, h200)
    assert datetime.fromisoformat(first["updated_at"]) == stored.updated_at
    assert (first["kernel_name"], first["bucket"], first["static_key"]) == (
        "qk_norm",
        16,
        stored.static_key,
    )


def test_json_export_of_one_device(tuned, h100):
    objects = json.loads(export_winners(tuned, "json", fingerprint=h100))
    assert [(o["gpu_name"], o["config"]["warps_per_block"]) for o in objects] == [
        ("NVIDIA H100 80GB HBM3", 8)
    ]


def test_csv_export(tuned, h200):
    reader = csv.DictReader(io.StringIO(export_winners(tuned, "csv")))
    rows = list(reader)
    # Every stored field of a winner, then the device; not what a winner says about the
    # environment that asks for it (measured_elsewhere), which is no stored data.
    stored = [f.name for f in dataclasses.fields(Winner) if f.name != "measured_elsewhere"]
    assert reader.fieldnames == stored + FINGERPRINT_FIELDS
    assert [(r["gpu_name"], float(r["median_us"])) for r in rows] == [
        ("NVIDIA H200", 2.0),
        ("NVIDIA H100 80GB HBM3", 3.0),
    ]
    assert json.loads(rows[0]["config_json"]) == {"vector_width": 8, "warps_per_block": 4}
    assert json.loads(rows[0]["static_key"])["head_dim"] == 128
    assert (rows[0]["sm_count"], rows[0]["bucket"]) == ("132", "16")


def test_empty_csv_export_is_a_header(db):
    lines = export_winners(db, "csv").splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("kernel_name,source_hash,static_key,bucket,config_json")


def test_empty_json_export_is_an_empty_list(db):
    assert json.loads(export_winners(db, "json")) == []


def test_unknown_format_lists_the_accepted_ones(db):
    with pytest.raises(ValueError, match="unknown export format 'yaml': expected one of json, csv"):
        export_winners(db, "yaml")


def test_shipped_winners_are_read_from_exports_under_the_fingerprint_policy(tuned, h200,
                                                                              tmp_path):
    from cutetune.results_db import shipped_winners

    assert shipped_winners(h200, tmp_path / "none") == []
    (tmp_path / "h200.json").write_text(export_winners(tuned, "json"))
    (served,) = shipped_winners(h200, tmp_path)  # the H100's winner is not served here
    assert (served.median_us, served.measured_elsewhere) == (2.0, "")
    patched = dataclasses.replace(h200, torch="2.9.1")
    (elsewhere,) = shipped_winners(patched, tmp_path)
    assert elsewhere.measured_elsewhere == "torch 2.9.0 (here 2.9.1)"
    assert shipped_winners(dataclasses.replace(h200, cutlass_dsl="4.9.0"), tmp_path) == []
