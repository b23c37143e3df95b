"""Bucket claims: how tuners sharing one database divide a model's buckets without a
coordinator of their own.

A tuner claims a bucket (kernel source, problem, device fingerprint, bucket) before it searches
it, with a lease it renews while it works (its heartbeat) and releases when the bucket is
stored. A claim is taken in one statement (INSERT ... ON CONFLICT DO UPDATE ... WHERE the lease
has expired), so of two tuners claiming one bucket at once exactly one gets it, on PostgreSQL
and on SQLite alike; a bucket whose holder died is free again once its lease expires. Leases
are compared with the claiming machine's clock: hosts sharing a database keep their clocks
within a small part of a lease of each other (NTP does).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, or_, update

from cutetune.results_db.dialects import insert_for
from cutetune.results_db.fingerprint import DeviceFingerprint
from cutetune.results_db.queries import _device_id, _get_or_create_id
from cutetune.results_db.schema import BucketClaimRow, KernelRow, ProblemRow
from cutetune.results_db.session import Database

_CLAIM_KEY = ("kernel_id", "problem_id", "device_id", "bucket")


@dataclass(frozen=True)
class BucketKey:
    """A bucket of one kernel source and static problem, as the results database keys it."""

    kernel_name: str
    source_hash: str
    static_key: str
    bucket: int


def claim_bucket(db: Database, fingerprint: DeviceFingerprint, key: BucketKey, owner: str,
                 lease_s: float) -> int | None:
    """Claim the bucket for `owner` until `lease_s` from now, where it is unclaimed, its lease
    has expired, or `owner` holds it already. Returns the claim's id, None where another
    holder's lease runs."""
    now = datetime.now(UTC)
    expires = now + timedelta(seconds=lease_s)
    with db.session() as session:
        values = {
            "kernel_id": _get_or_create_id(session, KernelRow, name=key.kernel_name,
                                           source_hash=key.source_hash),
            "problem_id": _get_or_create_id(session, ProblemRow, kernel_name=key.kernel_name,
                                            static_key=key.static_key),
            "device_id": _device_id(session, fingerprint),
            "bucket": key.bucket,
        }
        statement = insert_for(session, BucketClaimRow).values(
            **values, owner=owner, claimed_at=now, expires_at=expires)
        statement = statement.on_conflict_do_update(
            index_elements=_CLAIM_KEY,
            set_={"owner": owner, "claimed_at": now, "expires_at": expires},
            where=or_(BucketClaimRow.expires_at < now, BucketClaimRow.owner == owner),
        ).returning(BucketClaimRow.id)
        return session.execute(statement).scalar()


def renew_claim(db: Database, claim_id: int, owner: str, lease_s: float) -> bool:
    """Extend the lease of a claim `owner` holds to `lease_s` from now; False where it holds
    it no longer (its lease expired and another tuner took the bucket)."""
    expires = datetime.now(UTC) + timedelta(seconds=lease_s)
    with db.session() as session:
        renewed = session.execute(
            update(BucketClaimRow)
            .where(BucketClaimRow.id == claim_id, BucketClaimRow.owner == owner)
            .values(expires_at=expires))
        return renewed.rowcount == 1


def release_claim(db: Database, claim_id: int, owner: str) -> None:
    """Give the bucket up (stored, or left for another tuner); nothing where `owner` holds it
    no longer."""
    with db.session() as session:
        session.execute(delete(BucketClaimRow).where(BucketClaimRow.id == claim_id,
                                                     BucketClaimRow.owner == owner))
