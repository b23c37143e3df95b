"""What a tuning run does unless told otherwise (read by the CLI without importing the tuner)."""

from __future__ import annotations

# Trials per token bucket. Whole-model tuning on one H200 within 10 minutes per model sets it
# (BENCHMARKS.md, whole-model tuning); a kernel whose candidates fit it is searched exhaustively.
DEFAULT_BUDGET = 16
# Seconds a trial may run beyond ten times its predicted GPU time before its worker is killed.
DEFAULT_TRIAL_TIMEOUT_S = 30.0
# The least tie band between finalists, in percent: the p95 of how far the ratio of the same
# two finalists moves between fresh runs on the H200 (why: tuner/finals.py). --tie-band accepts
# 0 (the re-measurement's own spread alone) to MAX_TIE_BAND_PERCENT: a wider band would give
# away real wins to the fixed order.
DEFAULT_TIE_BAND_PERCENT = 3.0
MAX_TIE_BAND_PERCENT = 10.0
