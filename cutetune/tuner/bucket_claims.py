"""The buckets of a run, divided between every tuner on the database: N `cutetune tune`
processes (on one host or many) started on the same model take the buckets one at a time
through the database's claims (results_db/claims.py), and a process's GPU workers do the same
among themselves.

A tuner claims a bucket, then reads whether it is stored already (a peer finished it before
releasing its claim); it tunes a bucket it holds, renewing the lease every quarter lease while
it does, and releases the claim when the bucket is stored, or when it stops. A bucket a peer
holds is waited for: the tuner asks again every poll interval until the bucket is stored, or
until the peer's lease expires (it died) and the tuner takes the bucket over, continuing its
Optuna study from the stored trials as a resumed run does. A run therefore ends when every one
of its buckets is stored (or was tried here once and failed). A tuner stalled for a whole lease
(four missed renewals) may find its bucket taken over; both then store a run of it, and the
bucket keeps the faster winner, as after any two runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from cutetune.build.interrupt import raise_if_interrupted
from cutetune.results_db import (
    BucketKey,
    Database,
    DeviceFingerprint,
    StoredRun,
    claim_bucket,
    release_claim,
    renew_claim,
    stored_runs,
)
from cutetune.tuner.trial_owner import TrialOwner

# How long a claim holds without a heartbeat: a dead tuner's bucket waits this long for
# another. It is far longer than a heartbeat's round trip and a stall of a busy host.
DEFAULT_LEASE_S = 60.0
# How often a tuner waiting on its peers' buckets asks again: a run ends this soon after the
# last bucket is stored. A poll is a claim attempt per bucket left, cheap for the database.
POLL_S = 0.5


@dataclass(frozen=True)
class Taken:
    """A bucket this tuner holds: its index in the run's pending list, and the claim."""

    index: int
    bucket: Any  # model_run.PendingBucket
    claim_id: int


class BucketClaims:
    """The run's pending buckets, handed to its GPU workers one at a time, each claimed in the
    database first. `done_elsewhere(index, bucket, stored_run)` is told of each bucket a peer
    stored; where `force`, every bucket is tuned again, whatever is stored."""

    def __init__(self, db: Database, fingerprint: DeviceFingerprint, pending: Sequence[Any],
                 lease_s: float, done_elsewhere: Callable[[int, Any, StoredRun], None],
                 force: bool = False):
        self._db, self._fingerprint = db, fingerprint
        self._left = dict(enumerate(pending))
        self._lease_s = lease_s
        self._force = force  # a stored run does not settle a bucket: this run tunes it again
        self._done_elsewhere = done_elsewhere
        self._lock = threading.Lock()
        owner = TrialOwner.current()
        self.owner = f"{owner.machine} pid {owner.pid} started {owner.started}"

    @property
    def poll_s(self) -> float:
        return min(POLL_S, self._lease_s / 4)

    def take(self) -> Taken | None:
        """The next bucket this tuner holds, waiting while peers hold every bucket left; None
        once none is left. Ctrl-C (or a stop a worker thread asked for) ends the wait."""
        while True:
            with self._lock:
                taken = self._take_one()
                if taken is not None or not self._left:
                    return taken
            raise_if_interrupted()
            time.sleep(self.poll_s)

    def _take_one(self) -> Taken | None:
        for index, bucket in list(self._left.items()):
            key = bucket_key_of(bucket.planned)
            claim_id = claim_bucket(self._db, self._fingerprint, key, self.owner, self._lease_s)
            if claim_id is None:  # a live peer tunes it
                continue
            del self._left[index]
            if self._force:
                return Taken(index, bucket, claim_id)
            run = stored_runs(self._db, self._fingerprint, key.kernel_name, key.source_hash,
                              key.static_key).get(key.bucket)
            if run is not None and run.trials >= bucket.trials:  # a peer stored it
                release_claim(self._db, claim_id, self.owner)
                self._done_elsewhere(index, bucket, run)
                continue
            return Taken(index, bucket, claim_id)
        return None

    @contextmanager
    def holding(self, taken: Taken) -> Iterator[None]:
        """Renew the claim's lease while the block runs; release it at the end, however the
        block ends (a stopped bucket is continued by whichever tuner claims it next)."""
        stop = threading.Event()

        def keep_renewing() -> None:
            while not stop.wait(self._lease_s / 4):
                if not renew_claim(self._db, taken.claim_id, self.owner, self._lease_s):
                    return  # the lease expired and a peer holds the bucket now

        thread = threading.Thread(target=keep_renewing, daemon=True,
                                  name=f"cutetune-lease-{taken.claim_id}")
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            release_claim(self._db, taken.claim_id, self.owner)


def bucket_key_of(planned: Any) -> BucketKey:
    """The database's key of a planned bucket (tune.BucketPlan)."""
    return BucketKey(planned.kernel.name, planned.kernel.source_hash(),
                     planned.problem.static_key(), planned.bucket)
