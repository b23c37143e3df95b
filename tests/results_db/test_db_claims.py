"""Bucket claims (the contract tuners sharing a database divide buckets by), on each backend:
one holder at a time, a renewed lease holds, an expired one is taken over, a released bucket is
free, and another device's bucket is another claim."""

from __future__ import annotations

import threading
import time

from cutetune.results_db import BucketKey, claim_bucket, release_claim, renew_claim

KEY = BucketKey("qk_norm", "5f1e0c", '{"head_dim": 128}', 16)


def test_one_holder_at_a_time_until_it_releases(db, h200):
    claim = claim_bucket(db, h200, KEY, "tuner a", lease_s=60)
    assert claim is not None
    assert claim_bucket(db, h200, KEY, "tuner b", lease_s=60) is None
    assert claim_bucket(db, h200, KEY, "tuner a", lease_s=60) == claim  # its own: kept
    release_claim(db, claim, "tuner b")  # not b's to release
    assert claim_bucket(db, h200, KEY, "tuner b", lease_s=60) is None
    release_claim(db, claim, "tuner a")
    assert claim_bucket(db, h200, KEY, "tuner b", lease_s=60) is not None


def test_an_expired_lease_is_taken_over_and_its_holder_told(db, h200):
    claim = claim_bucket(db, h200, KEY, "tuner a", lease_s=0.3)
    assert renew_claim(db, claim, "tuner a", lease_s=0.3)
    assert claim_bucket(db, h200, KEY, "tuner b", lease_s=60) is None
    time.sleep(0.4)
    taken = claim_bucket(db, h200, KEY, "tuner b", lease_s=60)
    assert taken is not None
    assert not renew_claim(db, taken, "tuner a", lease_s=60)  # a lost it
    assert claim_bucket(db, h200, KEY, "tuner a", lease_s=60) is None


def test_other_devices_and_buckets_are_other_claims(db, h200, h100):
    assert claim_bucket(db, h200, KEY, "tuner a", lease_s=60) is not None
    assert claim_bucket(db, h100, KEY, "tuner b", lease_s=60) is not None
    other_bucket = BucketKey(KEY.kernel_name, KEY.source_hash, KEY.static_key, 32)
    assert claim_bucket(db, h200, other_bucket, "tuner b", lease_s=60) is not None
    new_source = BucketKey(KEY.kernel_name, "a0b1c2", KEY.static_key, KEY.bucket)
    assert claim_bucket(db, h200, new_source, "tuner b", lease_s=60) is not None


def test_of_tuners_claiming_at_once_exactly_one_gets_the_bucket(db, h200):
    start = threading.Barrier(8)
    got: list[str] = []

    def claim(owner: str) -> None:
        start.wait()
        if claim_bucket(db, h200, KEY, owner, lease_s=60) is not None:
            got.append(owner)

    threads = [threading.Thread(target=claim, args=(f"tuner {n}",)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(got) == 1
