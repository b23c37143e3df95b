"""Untuned problems served by the calibrated model (issue 42 item 4): with a calibration, what
no winner covers is served the model's predicted-best point (source `predicted`), chosen at
warmup and remembered for the next start; a miss on the call path still gets the heuristic
default; without a calibration nothing changes."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from cutetune.device.funnel import predicted_best
from cutetune.device.specs import DEVICE_SPECS
from cutetune.kernels import qk_norm as qk
from cutetune.serving.plan import DEFAULT, NEAREST, PREDICTED, TUNED, ServingPlan
from cutetune.serving.predicted import PredictedPicks
from cutetune.serving.table import Dispatcher
from cutetune.spaces.buckets import BUCKETS
from cutetune.spaces.models import load_model
from cutetune.spaces.space import config_to_json
from testkit.known_cost_model import KNOWN
from testkit.stored_winners import winner

SPEC = DEVICE_SPECS["H200"]
LARGE = qk.QKNormConfig(vector_bits=128, heads_per_warp=4, warps_per_block=8)


@pytest.fixture(scope="module")
def qwen3_8b() -> qk.QKNormProblem:
    (problem,) = qk.problems_for_model(load_model("qwen3-8b"), "bfloat16")
    return problem


@pytest.fixture
def fake_compile():
    calls = []

    def compile_(problem, config, options=""):
        calls.append(config)
        return ("compiled", config)

    return dataclasses.replace(qk.KERNEL, compile_function=compile_), calls


def expected_picks(kernel, problem) -> list:
    return [predicted_best(kernel, problem.with_tokens(b), SPEC, KNOWN,
                           kernel.default_config(problem.with_tokens(b), SPEC))
            for b in BUCKETS]


def test_an_untuned_problem_is_served_the_calibrated_models_picks(qwen3_8b, fake_compile):
    kernel, calls = fake_compile
    dispatcher = Dispatcher(SPEC, calibrated=KNOWN)
    dispatcher.warmup(kernel, [qwen3_8b])
    (table,) = dispatcher.tables()
    assert [e.source for e in table.entries] == [PREDICTED] * len(BUCKETS)
    picks = expected_picks(kernel, qwen3_8b)
    assert [e.config for e in table.entries] == picks
    defaults = [kernel.default_config(qwen3_8b.with_tokens(b), SPEC) for b in BUCKETS]
    assert picks != defaults, "the known model must disagree with the heuristic somewhere"
    assert len(calls) == len(set(picks))
    # Served as a winner is: the route may serve it, and no call counts as the default's.
    static = qwen3_8b.static_tuple()
    assert dispatcher.serving(kernel, static, 3).route_row is not None
    assert dispatcher.default_calls() == {}
    assert (f"predicted 1..{BUCKETS[-1]} ({len(BUCKETS)}); default none"
            in dispatcher.report())


def test_a_nearest_tuned_winner_comes_before_a_prediction(qwen3_8b, fake_compile):
    kernel, _ = fake_compile
    dispatcher = Dispatcher(SPEC, [winner(kernel, qwen3_8b, 4096, LARGE)], calibrated=KNOWN)
    dispatcher.warmup(kernel, [qwen3_8b])
    (table,) = dispatcher.tables()
    assert {e.source for e in table.entries} == {NEAREST, TUNED}


def test_a_miss_on_the_call_path_is_served_the_default_not_a_prediction(qwen3_8b,
                                                                        fake_compile):
    kernel, _ = fake_compile
    dispatcher = Dispatcher(SPEC, calibrated=KNOWN)
    dispatcher.lookup(kernel, qwen3_8b.static_tuple(), 1)
    (table,) = dispatcher.tables()
    assert {e.source for e in table.entries} == {DEFAULT}
    assert dispatcher.default_calls() == {("qk_norm", qwen3_8b.static_tuple(), 1): 1}


def test_without_a_calibration_the_default_serves(qwen3_8b, fake_compile):
    kernel, _ = fake_compile
    plan = ServingPlan(SPEC)
    assert {e.source for e in plan.entries(kernel, qwen3_8b)} == {DEFAULT}


def test_picks_are_remembered_in_a_file_and_keyed_by_the_calibration(qwen3_8b, tmp_path,
                                                                      monkeypatch):
    kernel = qk.KERNEL
    path = tmp_path / "picks.json"
    picks = PredictedPicks(KNOWN, SPEC, path)
    first = picks.for_problem(kernel, qwen3_8b)
    assert not path.exists()  # written when saved
    picks.save()
    stored = json.loads(path.read_text())
    assert list(stored.values()) == [[config_to_json(c) for c in first]]

    # The next start reads them instead of enumerating the space.
    def no_enumeration(*args):
        raise AssertionError("the space was enumerated again")

    again = PredictedPicks(KNOWN, SPEC, path)
    with monkeypatch.context() as m:
        m.setattr("cutetune.serving.predicted.predicted_best", no_enumeration)
        assert again.for_problem(kernel, qwen3_8b) == first
    # Another calibration picks again.
    other = PredictedPicks(dataclasses.replace(KNOWN, wave_us=0.5), SPEC, path)
    other.for_problem(kernel, qwen3_8b)
    other.save()
    assert len(json.loads(path.read_text())) == 2
    # An unreadable file is picked over, not an error.
    path.write_text("{not json")
    assert PredictedPicks(KNOWN, SPEC, path).for_problem(kernel, qwen3_8b) == first


def test_reading_a_calibration_imports_no_sqlalchemy_optuna_or_cutedsl(tmp_path):
    script = ("import sys\n"
              "from cutetune.results_db import DeviceFingerprint, calibration_to_serve_at\n"
              "from cutetune.serving.predicted import PredictedPicks\n"
              "here = DeviceFingerprint('NVIDIA H200', '9.0', 132, '1', '1', '1', '1')\n"
              "print(calibration_to_serve_at(sys.argv[1], here),\n"
              "      sorted({m.split('.')[0] for m in sys.modules}\n"
              "             & {'sqlalchemy', 'optuna', 'cutlass'}))\n")
    import sqlite3

    path = tmp_path / "empty.db"
    sqlite3.connect(path).execute("CREATE TABLE devices (id INTEGER)").connection.close()
    done = subprocess.run([sys.executable, "-c", script, f"sqlite:///{path}"],
                          capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["None", "[]"]
