"""The token-count bucketing policy, shared by the tuner and the dispatcher.

Buckets are powers of two from 1 to 2**20 tokens: each bucket is tuned at its own token count,
and a call with n tokens is served by the smallest bucket >= n. Powers of two keep the number of
tuning runs logarithmic in the token range while the decode sizes (1, 2, 4, ...) stay exact.
"""

from __future__ import annotations

MAX_BUCKET = 1 << 20
BUCKETS: tuple[int, ...] = tuple(1 << i for i in range(MAX_BUCKET.bit_length()))
# The buckets tuned, benched and reported by default: every power of two from decode (1 token)
# to long prefill.
DEFAULT_TUNE_TOKENS: tuple[int, ...] = tuple(1 << i for i in range(16))


def bucket_of(num_tokens: int) -> int:
    """The bucket that serves a call of `num_tokens` (beyond the largest: the largest)."""
    if num_tokens < 1:
        raise ValueError(f"token count must be at least 1, got {num_tokens}")
    return min(1 << (num_tokens - 1).bit_length(), MAX_BUCKET)


def bucket_index(num_tokens: int) -> int:
    """Position of `bucket_of(num_tokens)` in BUCKETS, for table lookups on the hot path."""
    return min((num_tokens - 1).bit_length(), len(BUCKETS) - 1)


def check_bucket(bucket: int) -> None:
    """ValueError unless `bucket` is one of BUCKETS: a stored or imported winner's bucket must
    be one that tuning and serving use."""
    if type(bucket) is not int or bucket not in BUCKETS:
        raise ValueError(f"{bucket!r} is not a power of two from 1 to {MAX_BUCKET}")
