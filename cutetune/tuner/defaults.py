"""What a tuning run does unless told otherwise (read by the CLI without importing the tuner)."""

from __future__ import annotations

# Trials per token bucket. Whole-model tuning on one H200 within 10 minutes per model sets it
# (BENCHMARKS.md, whole-model tuning); a kernel whose candidates fit it is searched exhaustively.
DEFAULT_BUDGET = 16
# Seconds a trial may run beyond ten times its predicted GPU time before its worker is killed.
DEFAULT_TRIAL_TIMEOUT_S = 30.0
