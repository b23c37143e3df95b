"""Validation of the records the tuner hands to the results database."""

from __future__ import annotations

import dataclasses
from datetime import datetime

import pytest

from cutetune.results_db import TrialRecord


def test_unknown_status_is_rejected(ok_trial):
    with pytest.raises(ValueError, match="status 'pruned' is not one of"):
        dataclasses.replace(ok_trial(0, 2.0, 4), status="pruned")


def test_ok_trial_needs_a_median(ok_trial):
    with pytest.raises(ValueError, match="trial 0 is ok but has no median_us"):
        dataclasses.replace(ok_trial(0, 2.0, 4), median_us=None)


@pytest.mark.parametrize("reason", [None, ""])
def test_failed_trial_needs_a_reason(failed_trial, reason):
    with pytest.raises(ValueError, match="trial 3 failed but has no failure_reason"):
        dataclasses.replace(failed_trial(3, 4, "compile error"), failure_reason=reason)


@pytest.mark.parametrize(
    "config_json",
    [
        '{"warps_per_block": 4, "vector_width": 8}',  # keys out of order
        '{"vector_width":8,"warps_per_block":4}',  # not json.dumps' separators
        "[4, 8]",  # not an object
    ],
)
def test_config_must_be_canonical_json_of_an_object(ok_trial, config_json):
    with pytest.raises(ValueError, match="is not the canonical JSON of an object"):
        dataclasses.replace(ok_trial(0, 2.0, 4), config_json=config_json)


def test_config_must_parse(ok_trial):
    with pytest.raises(ValueError, match="config_json is not JSON"):
        dataclasses.replace(ok_trial(0, 2.0, 4), config_json="{warps: 4}")


def test_canonical_config_is_accepted(ok_trial):
    trial = dataclasses.replace(ok_trial(0, 2.0, 4), config_json='{"a": 1, "b": [2, 3]}')
    assert isinstance(trial, TrialRecord)
    assert trial.config_json == '{"a": 1, "b": [2, 3]}'


def test_winner_number_of_a_failed_trial_is_rejected(make_result):
    result = make_result()
    assert result.trials[2].status == "failed"
    expected = r"winner_number 2 is not an ok trial \(ok trials: \[0, 1\]"
    with pytest.raises(ValueError, match=expected):
        dataclasses.replace(result, winner_number=2)


def test_winner_number_outside_the_trials_is_rejected(make_result):
    with pytest.raises(ValueError, match="winner_number 7 is not an ok trial"):
        dataclasses.replace(make_result(), winner_number=7)


def test_no_winner_is_allowed(make_result, failed_trial):
    result = dataclasses.replace(
        make_result(), trials=(failed_trial(0, 4, "ptxas error"),), winner_number=None
    )
    assert result.winner_number is None


def test_repeated_trial_numbers_are_rejected(make_result, ok_trial):
    with pytest.raises(ValueError, match=r"trial numbers repeat: \[0, 0\]"):
        dataclasses.replace(make_result(), trials=(ok_trial(0, 2.0, 4), ok_trial(0, 3.0, 8)))


@pytest.mark.parametrize("name", ["started_at", "finished_at"])
def test_naive_times_are_rejected(make_result, name):
    with pytest.raises(ValueError, match=f"{name} must carry a time zone"):
        dataclasses.replace(make_result(), **{name: datetime(2026, 1, 5, 12, 0)})
