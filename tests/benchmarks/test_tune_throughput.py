"""benchmarks/tune_throughput.py counts the trials a run stored, and stops with the run's own
error where a run fails (here: no GPU)."""

import shutil

import pytest
import torch

from benchmarks import tune_throughput
from cutetune.results_db import Database, trials_frame
from testkit.h200_results import H200_RESULTS


def test_the_trials_of_a_run_are_those_its_database_stored(tmp_path):
    url = f"sqlite:///{shutil.copy(H200_RESULTS, tmp_path / 'run.db')}"
    db = Database.open(url)
    expected = len(trials_frame(db))
    db.dispose()
    assert expected > 0 and tune_throughput.stored_trials(url) == expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="the failing run needs a machine "
                    "without a GPU")
def test_a_failed_run_stops_with_its_error(tmp_path):
    with pytest.raises(SystemExit, match=r"(?s)--gpus 0: .* failed \(2\):.*needs a CUDA GPU"):
        tune_throughput.timed_run("qwen3-0.6b", "0", ["qk_norm", "--tokens", "1"], tmp_path)
