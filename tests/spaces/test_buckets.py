"""Token-count buckets: powers of two from 1 to 2**20, clamped at the top."""

import pytest

from cutetune.spaces.buckets import BUCKETS, MAX_BUCKET, bucket_index, bucket_of


@pytest.mark.parametrize(("tokens", "bucket"), [
    (1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (511, 512), (512, 512), (513, 1024),
    (2**20, 2**20), (2**20 + 1, 2**20), (10**9, 2**20),
])
def test_bucket_of(tokens, bucket):
    assert bucket_of(tokens) == bucket


def test_buckets_are_the_powers_of_two_up_to_max():
    assert MAX_BUCKET == 2**20
    assert BUCKETS == tuple(2**i for i in range(21))


def test_bucket_index_agrees_with_bucket_of():
    tokens = [*range(1, 5000), *(2**i + d for i in range(12, 23) for d in (-1, 0, 1))]
    for n in tokens:
        assert BUCKETS[bucket_index(n)] == bucket_of(n), n


@pytest.mark.parametrize("tokens", [0, -1])
def test_bucket_of_rejects_non_positive(tokens):
    with pytest.raises(ValueError, match="at least 1"):
        bucket_of(tokens)
