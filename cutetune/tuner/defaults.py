"""What a tuning run does unless told otherwise (read by the CLI without importing the tuner)."""

from __future__ import annotations

# Trials per token bucket. Whole-model tuning on one H200 within 10 minutes per model sets it
# (BENCHMARKS.md, whole-model tuning); a kernel whose candidates fit it is searched exhaustively.
DEFAULT_BUDGET = 16
# Buckets tuned by default: every power of two from decode (1 token) to long prefill.
DEFAULT_TUNE_TOKENS: tuple[int, ...] = tuple(1 << i for i in range(16))
# Seconds a trial may run beyond ten times its predicted GPU time before its worker is killed.
DEFAULT_TRIAL_TIMEOUT_S = 30.0
