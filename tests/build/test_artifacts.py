"""The artifact store reads its directory once for all the points a warmup looks up (issue 38
item 5): a tuned host's cache holds thousands of files, and searching them for each point cost
a warm start seconds. A point stored after that reading, or a file removed since, is still
found, or missed, as it is now. The files here are named as stored artifacts are but hold
anything: finding a point checks its name and content digest, not that it loads."""

from __future__ import annotations

import os
from pathlib import Path

from cutetune.build.artifacts import ArtifactStore
from cutetune.build.publish import publish
from cutetune.kernels.activation import ActivationConfig, SiluAndMulProblem
from cutetune.kernels.registry import get_kernel

KERNEL = get_kernel("silu_and_mul")
PROBLEM = SiluAndMulProblem(num_tokens=1, dtype="bfloat16", intermediate=3072)
POINTS = [ActivationConfig(vector_bits=128, vectors_per_thread=1, warps_per_block=warps,
                           cache_hints="normal") for warps in (1, 4, 8)]


def store_file(store: ArtifactStore, config: ActivationConfig) -> Path:
    """A file published under the point's key, as a compile stores one."""
    return publish(store.directory / store.key(KERNEL, PROBLEM, config),
                   lambda path: path.write_bytes(os.urandom(64)))


def test_a_warm_lookup_of_every_point_reads_the_directory_once(tmp_path, monkeypatch):
    store = ArtifactStore(tmp_path, "sm_90a")
    stored = {config: store_file(store, config) for config in POINTS}
    for number in range(200):  # other points' artifacts, as a tuned host's cache holds
        (tmp_path / f"{number:032x}-{number:016x}.so").write_bytes(b"")
    searches = []
    glob = Path.glob
    monkeypatch.setattr(Path, "glob", lambda self, pattern: searches.append(pattern)
                        or glob(self, pattern))
    again = ArtifactStore(tmp_path, "sm_90a")  # another process's
    assert again.stored_keys() >= {again.key(KERNEL, PROBLEM, c) for c in POINTS}
    assert [again.find(KERNEL, PROBLEM, config) for config in POINTS] == list(stored.values())
    assert searches == ["*-*.so"]


def test_a_point_stored_after_the_reading_is_found_and_one_removed_is_missed(tmp_path):
    store = ArtifactStore(tmp_path, "sm_90a")
    first, later = POINTS[0], POINTS[1]
    path = store_file(store, first)
    assert store.find(KERNEL, PROBLEM, later) is None  # the directory is read here
    stored_later = store_file(store, later)  # by another process
    assert store.find(KERNEL, PROBLEM, later) == stored_later
    path.unlink()  # `cutetune cache clear`, say
    assert store.find(KERNEL, PROBLEM, first) is None
    assert store.counts.unsound == 0
