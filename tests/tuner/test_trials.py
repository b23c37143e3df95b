"""The GPU trial runner's arithmetic that needs no GPU."""

import pytest

from cutetune.device.measure import Measurement
from cutetune.tuner.trials import drift_corrected


def test_drift_correction_removes_the_reference_shift():
    measured = Measurement(median_us=1.45, iqr_us=0.01, repeats=25)
    # The reference first read 1.25 us and now reads 1.43: the GPU is in its slow state.
    corrected = drift_corrected(measured, reference_now_us=1.43, reference_first_us=1.25)
    assert corrected.median_us == pytest.approx(1.27)
    assert (corrected.iqr_us, corrected.repeats) == (0.01, 25)


def test_no_drift_leaves_the_time_alone():
    measured = Measurement(median_us=2.0, iqr_us=0.02, repeats=25)
    assert drift_corrected(measured, 1.3, 1.3) == measured
