"""The Dispatcher on the CPU: tables built from hand-made winners, misses, counts, the cache.

The qk_norm tests compile for sm_90a (a handful of compiles in all); the rules that need many
tables (constraints, bucket mapping, the compile cache) use a tiny KernelDef whose compile
returns a plain object.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from dataclasses import dataclass
from typing import Any

import pytest

from cutetune.device.funnel import Lender
from cutetune.device.specs import DEVICE_SPECS
from cutetune.kernels import qk_norm as qk
from cutetune.kernels.registry import KernelDef
from cutetune.serving.plan import BORROWED, DEFAULT, NEAREST, SHIPPED, TUNED, nearest_tuned
from cutetune.serving.table import Dispatcher
from cutetune.spaces.buckets import BUCKETS, MAX_BUCKET
from cutetune.spaces.models import load_model
from cutetune.spaces.problem import Problem
from cutetune.spaces.space import Constraint, Param, Space
from testkit.stored_winners import winner

SPEC = DEVICE_SPECS["H200"]
STALE_HASH = "0123456789abcdef"
SMALL = qk.QKNormConfig(vector_bits=128, heads_per_warp=2, warps_per_block=1)
LARGE = qk.QKNormConfig(vector_bits=128, heads_per_warp=4, warps_per_block=8)


def entries_by_bucket(dispatcher: Dispatcher) -> dict[int, Any]:
    (table,) = dispatcher.tables()
    assert [e.bucket for e in table.entries] == list(BUCKETS)
    return {e.bucket: e for e in table.entries}


@pytest.fixture(scope="module")
def qwen3_8b() -> qk.QKNormProblem:
    (problem,) = qk.problems_for_model(load_model("qwen3-8b"), "bfloat16")
    return problem


def _counting(problem_type, built: list):
    """`problem_type` whose from_static_tuple records each problem it builds in `built`."""

    class Counting(problem_type):
        @classmethod
        def from_static_tuple(cls, static, num_tokens):
            built.append(static)
            return problem_type.from_static_tuple(static, num_tokens)

    return Counting


def qk_static_tuple(problem: qk.QKNormProblem) -> tuple:
    # What the public op `qk_norm` passes to lookup.
    return qk.QKNormProblem.static_tuple_of(
        dtype=problem.dtype, head_dim=problem.head_dim, q_heads=problem.q_heads,
        kv_heads=problem.kv_heads, eps=float(problem.eps),
        weight_bias=float(problem.weight_bias))


@pytest.fixture
def qk_fake_compile():
    """qk_norm (same space, defaults and source hash) whose compile only records its calls."""
    calls = []

    def compile_(problem, config, options=""):
        calls.append((problem.static_key(), config))
        return FakeCompiled(problem, config)

    return dataclasses.replace(qk.KERNEL, compile_function=compile_), calls


# -- a tiny kernel whose constraint depends on the token count ----------------------------------


@dataclass(frozen=True, kw_only=True)
class TinyProblem(Problem):
    width: int


@dataclass(frozen=True)
class TinyConfig:
    block: int


@dataclass(frozen=True, eq=False)
class FakeCompiled:
    problem: Problem
    config: Any


TINY_SPACE = Space(
    config_type=TinyConfig,
    params=(Param("block", BUCKETS, "tokens per block"),),
    constraints=(
        Constraint("block_within_tokens", "a block may not exceed the token count",
                   lambda p, c, d: c.block <= p.num_tokens),
    ),
)


def tiny_kernel() -> tuple[KernelDef, list]:
    """A KernelDef whose default at each bucket is a config of its own (block = bucket), so a
    served object tells which bucket's entry served it; `calls` records every compile."""
    calls = []

    def compile_(problem, config, options=""):
        calls.append((problem.static_key(), config))
        return FakeCompiled(problem, config)

    def unused(*args):
        raise AssertionError("the dispatcher must not call this")

    kernel = KernelDef(
        name="tiny",
        description="test kernel",
        problem_type=TinyProblem,
        space=TINY_SPACE,
        problems_for_model=unused,
        default_config=lambda p, d: TinyConfig(block=p.num_tokens),
        cost=unused,
        compile_function=compile_,
        launch=unused,
        make_inputs=unused,
        reference=unused,
        outputs=("y",),
        written_in_place=(),
        tolerance={},
        source_file=__file__,
    )
    return kernel, calls


# -- nearest_tuned --------------------------------------------------------------------------


def test_nearest_tuned_is_none_when_nothing_is_tuned():
    assert nearest_tuned(16, []) is None


@pytest.mark.parametrize(("bucket", "tuned", "expected"), [
    (16, [16], 16),
    (1, [8, 4096], 8),
    (128, [8, 4096], 8),  # log2 distance 4 vs 5
    (256, [8, 4096], 4096),  # 5 vs 4
    (MAX_BUCKET, [1, 2], 2),
    (1, [MAX_BUCKET, 64], 64),
])
def test_nearest_tuned_picks_the_closest_in_log2(bucket, tuned, expected):
    assert nearest_tuned(bucket, tuned) == expected


@pytest.mark.parametrize("tuned", [[4, 64], [64, 4]])
def test_nearest_tuned_ties_go_to_the_larger_bucket(tuned):
    assert nearest_tuned(16, tuned) == 64  # 16 is two doublings from both
    assert nearest_tuned(2, [1, 4]) == 4


# -- warmup with qk_norm winners --------------------------------------------------------------


def test_warmup_serves_tuned_and_nearest_buckets_with_real_compiles(qwen3_8b):
    kernel = qk.KERNEL
    dispatcher = Dispatcher(SPEC, [winner(kernel, qwen3_8b, 8, SMALL),
                                   winner(kernel, qwen3_8b, 4096, LARGE)])
    stats = dispatcher.warmup(kernel, [qwen3_8b])

    entries = entries_by_bucket(dispatcher)
    assert (entries[8].source, entries[8].config, entries[8].tuned_bucket) == (TUNED, SMALL, 8)
    assert (entries[4096].source, entries[4096].config) == (TUNED, LARGE)
    assert entries[4096].tuned_bucket == 4096
    for bucket in BUCKETS:
        if bucket in (8, 4096):
            continue
        near = 8 if bucket <= 128 else 4096
        entry = entries[bucket]
        assert (entry.source, entry.tuned_bucket) == (NEAREST, near), bucket
        assert entry.config == (SMALL if near == 8 else LARGE), bucket
    (table,) = dispatcher.tables()
    assert table.warmed_up and table.problem.static_key() == qwen3_8b.static_key()

    # Two distinct configs serve all 21 buckets: two compiles, not one per bucket.
    assert (stats.problems, stats.points, stats.stale_winners) == (1, 2, 0)
    assert stats.seconds > 0
    assert dispatcher.stats == {"qk_norm": stats}

    static = qk_static_tuple(qwen3_8b)
    assert static == qwen3_8b.static_tuple()
    served = {n: dispatcher.lookup(kernel, static, n) for n in (1, 8, 100, 4096, 5000)}
    assert served[1] is served[8] is served[100]
    assert served[4096] is served[5000]
    assert served[1] is not served[4096]
    assert dispatcher.default_calls() == {}

    report = dispatcher.report()
    assert "warmup of qk_norm: 1 problems, 2 points (0 from the artifact cache)" in report
    assert "no artifact cache: every point compiled in memory" in report
    assert "0 winners ignored" in report
    assert "tuned buckets 8,4096" in report
    assert "default none" in report
    assert "NOT warmed up" not in report


def test_stale_winner_is_ignored_and_counted(qwen3_8b, qk_fake_compile):
    kernel, calls = qk_fake_compile
    dispatcher = Dispatcher(SPEC, [winner(kernel, qwen3_8b, 8, SMALL, STALE_HASH),
                                   winner(kernel, qwen3_8b, 4096, LARGE)])
    stats = dispatcher.warmup(kernel, [qwen3_8b])

    entries = entries_by_bucket(dispatcher)
    assert all(e.source != TUNED or e.bucket == 4096 for e in entries.values())
    # Bucket 8's stale winner is not served: the current winner at 4096 serves every bucket.
    assert (entries[8].source, entries[8].config, entries[8].tuned_bucket) == (
        NEAREST, LARGE, 4096)
    assert {e.config for e in entries.values()} == {LARGE}
    assert stats.stale_winners == 1
    assert stats.points == 1 == len(calls)
    assert "1 winners ignored" in dispatcher.report()


def test_only_stale_winners_leave_the_heuristic_defaults(qwen3_8b, qk_fake_compile):
    kernel, calls = qk_fake_compile
    dispatcher = Dispatcher(SPEC, [winner(kernel, qwen3_8b, b, SMALL, STALE_HASH)
                                   for b in (1, 8, 4096)])
    stats = dispatcher.warmup(kernel, [qwen3_8b])

    entries = entries_by_bucket(dispatcher)
    for bucket, entry in entries.items():
        assert entry.source == DEFAULT and entry.tuned_bucket is None
        assert entry.config == kernel.default_config(qwen3_8b.with_tokens(bucket), SPEC)
    assert stats.stale_winners == 3
    # The heuristic picks one warp per block up to 4 tokens (160 heads) and 8 warps beyond.
    assert stats.points == len({e.config for e in entries.values()}) == 2 == len(calls)
    assert "tuned buckets none" in dispatcher.report()


def test_current_winner_survives_a_stale_winner_of_the_same_bucket(qwen3_8b, qk_fake_compile):
    kernel, _ = qk_fake_compile
    # winners() orders by source hash; a stale hash that sorts after the current one comes last.
    stale = "f" * 16 if kernel.source_hash() < "f" * 16 else "0" * 16
    records = [winner(kernel, qwen3_8b, 64, SMALL), winner(kernel, qwen3_8b, 64, LARGE, stale)]
    records.sort(key=lambda w: w.source_hash != kernel.source_hash())
    dispatcher = Dispatcher(SPEC, records)
    stats = dispatcher.warmup(kernel, [qwen3_8b])
    entry = entries_by_bucket(dispatcher)[64]
    assert (entry.source, entry.config) == (TUNED, SMALL)
    assert stats.stale_winners == 1


def test_another_problems_winner_is_borrowed_and_another_kernels_never(qwen3_8b,
                                                                       qk_fake_compile):
    kernel, _ = qk_fake_compile
    other = dataclasses.replace(qwen3_8b, q_heads=16)
    tiny, _ = tiny_kernel()
    dispatcher = Dispatcher(SPEC, [
        winner(kernel, other, 8, LARGE),
        winner(tiny, TinyProblem(num_tokens=1, width=4), 8, TinyConfig(block=8)),
    ])
    dispatcher.warmup(kernel, [qwen3_8b])
    entries = entries_by_bucket(dispatcher)
    assert (entries[8].source, entries[8].config, entries[8].lender) == (
        BORROWED, LARGE, Lender(kernel.name, other.static_key()))
    assert {e.source for b, e in entries.items() if b != 8} == {DEFAULT}
    assert "borrowed 8" in dispatcher.report()


# -- constraints at other buckets ------------------------------------------------------------


def test_nearest_winner_invalid_at_a_bucket_is_not_served_there():
    kernel, _ = tiny_kernel()
    problem = TinyProblem(num_tokens=1, width=4)
    dispatcher = Dispatcher(SPEC, [winner(kernel, problem, 64, TinyConfig(block=64))])
    dispatcher.warmup(kernel, [problem])

    entries = entries_by_bucket(dispatcher)
    assert (entries[64].source, entries[64].config) == (TUNED, TinyConfig(block=64))
    for bucket, entry in entries.items():
        # Every served config is a valid point at its bucket.
        assert TINY_SPACE.first_violation(problem.with_tokens(bucket), entry.config, SPEC) is None
        if bucket < 64:  # block 64 > tokens: the heuristic default instead
            assert (entry.source, entry.config) == (DEFAULT, TinyConfig(block=bucket))
        elif bucket > 64:
            assert (entry.source, entry.tuned_bucket) == (NEAREST, 64)
            assert entry.config == TinyConfig(block=64)


def test_qk_norm_constraints_do_not_depend_on_the_token_count(qwen3_8b):
    # Why the rule above is tested with the tiny kernel: no qk_norm point is valid at one
    # bucket and invalid at another.
    small, large = qwen3_8b.with_tokens(1), qwen3_8b.with_tokens(MAX_BUCKET)
    assert qk.SPACE.enumerate(small, SPEC).valid == qk.SPACE.enumerate(large, SPEC).valid


# -- misses, default counts, the compile cache ------------------------------------------------


def test_lookup_without_warmup_serves_defaults_warns_once_and_counts(qwen3_8b, caplog):
    kernel = qk.KERNEL
    dispatcher = Dispatcher(SPEC)
    static = qk_static_tuple(qwen3_8b)
    built = []
    kernel = dataclasses.replace(kernel, problem_type=_counting(qk.QKNormProblem, built))

    with caplog.at_level(logging.WARNING, logger="cutetune.serving"):
        served = [dispatcher.lookup(kernel, static, n) for n in (1, 3, 3, 5000)]

    warnings = [r for r in caplog.records if r.name == "cutetune.serving"]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert "was not warmed up" in warnings[0].getMessage()
    assert "qk_norm" in warnings[0].getMessage()
    assert len(built) == 1  # the problem is built on the miss only

    (table,) = dispatcher.tables()
    assert not table.warmed_up
    assert {e.source for e in table.entries} == {DEFAULT}
    assert dispatcher.default_calls() == {
        ("qk_norm", static, 1): 1, ("qk_norm", static, 4): 2, ("qk_norm", static, 8192): 1}
    # Buckets 1 and 4 share the one-warp default; 8192 uses 8 warps: two distinct kernels.
    assert served[0] is served[1] is served[2]
    assert served[3] is not served[0]
    assert dispatcher.stats == {}

    report = dispatcher.report()
    assert "NOT warmed up" in report
    assert "calls served by default: 4" in report


def test_warmed_up_tuned_bucket_is_not_counted_but_a_default_bucket_is():
    kernel, calls = tiny_kernel()
    problem = TinyProblem(num_tokens=1, width=4)
    dispatcher = Dispatcher(SPEC, [winner(kernel, problem, 64, TinyConfig(block=64))])
    dispatcher.warmup(kernel, [problem])
    compiles = len(calls)

    built = []
    kernel = dataclasses.replace(kernel, problem_type=_counting(TinyProblem, built))
    served = dispatcher.lookup(kernel, problem.static_tuple(), 64)
    assert served.config == TinyConfig(block=64)
    dispatcher.lookup(kernel, problem.static_tuple(), 1000)  # nearest: 64
    assert dispatcher.default_calls() == {}
    dispatcher.lookup(kernel, problem.static_tuple(), 2)  # below 64: default
    assert built == []  # a warmed-up problem is never rebuilt
    assert dispatcher.default_calls() == {("tiny", problem.static_tuple(), 2): 1}
    assert len(calls) == compiles  # serving never compiles after warmup
    assert "calls served by default: 1" in dispatcher.report()


def test_compile_cache_returns_the_same_object_for_the_same_config():
    kernel, calls = tiny_kernel()
    a = TinyProblem(num_tokens=1, width=4)
    b = TinyProblem(num_tokens=1, width=8)
    dispatcher = Dispatcher(SPEC, [winner(kernel, a, 16, TinyConfig(block=16))])
    dispatcher.warmup(kernel, [a])
    # Defaults block=1,2,4,8 below the winner, its block 16 from 16 up: five compiles.
    assert sorted(config.block for _, config in calls) == [1, 2, 4, 8, 16]
    first = dispatcher.lookup(kernel, a.static_tuple(), 16)
    assert first.config == TinyConfig(block=16)
    assert dispatcher.lookup(kernel, a.static_tuple(), 9) is first
    assert dispatcher.lookup(kernel, a.static_tuple(), 3000) is first  # nearest
    assert dispatcher.lookup(kernel, a.static_tuple(), 5) is not first

    # Warming up the same problem again reuses every compiled object.
    stats = dispatcher.warmup(kernel, [a])
    assert stats.points == 0 and len(calls) == 5
    assert dispatcher.lookup(kernel, a.static_tuple(), 16) is first

    # Another static problem with the same config is a different specialisation.
    other = dispatcher.lookup(kernel, b.static_tuple(), 16)
    assert other is not first and other.config == first.config
    assert other.problem.static_key() == b.static_key()
    assert len(calls) == 5 + len(BUCKETS)  # b was not warmed up: a default per bucket


@pytest.mark.parametrize(("tokens", "bucket"), [
    (1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (1000, 1024), (5000, 8192),
    (MAX_BUCKET, MAX_BUCKET), (2**21, MAX_BUCKET),
])
def test_lookup_maps_token_counts_to_buckets(tokens, bucket):
    kernel, _ = tiny_kernel()
    problem = TinyProblem(num_tokens=1, width=4)
    dispatcher = Dispatcher(SPEC)
    served = dispatcher.lookup(kernel, problem.static_tuple(), tokens)
    assert served.config == TinyConfig(block=bucket)  # the default of that bucket
    assert dispatcher.default_calls() == {("tiny", problem.static_tuple(), bucket): 1}


def test_calls_beyond_the_largest_bucket_are_served_by_it_and_reported():
    kernel, _ = tiny_kernel()
    problem = TinyProblem(num_tokens=1, width=4)
    dispatcher = Dispatcher(SPEC)
    for tokens in (MAX_BUCKET, MAX_BUCKET + 1, 5 * MAX_BUCKET):
        served = dispatcher.lookup(kernel, problem.static_tuple(), tokens)
        assert served.config == TinyConfig(block=MAX_BUCKET)
    assert dispatcher.beyond_calls() == {("tiny", problem.static_tuple()): 2}
    assert f"calls beyond {MAX_BUCKET} tokens, served by that bucket: 2" in dispatcher.report()


@pytest.mark.skipif(__import__("torch").cuda.is_available(),
                    reason="checks the dispatcher where no CUDA GPU is visible")
# -- the stand-in, the seam for host-time measurement ----------------------------------------


@dataclass(frozen=True)
class Bound:
    """What a kernel's `bind` made of a function for one bucket's point."""

    problem: Problem
    config: Any
    function: Any


def test_a_stand_in_serves_every_bucket_as_tuned_meanwhile_and_the_rows_come_back(
        monkeypatch):
    kernel, calls = tiny_kernel()
    kernel = dataclasses.replace(kernel, bind=Bound)
    forgotten = []
    monkeypatch.setattr("cutetune.serving.table.forget_all", lambda: forgotten.append(1))
    warmed, missed = TinyProblem(num_tokens=1, width=4), TinyProblem(num_tokens=1, width=8)
    dispatcher = Dispatcher(SPEC, [winner(kernel, warmed, 64, TinyConfig(block=64))])
    dispatcher.warmup(kernel, [warmed])
    before = {n: dispatcher.lookup(kernel, warmed.static_tuple(), n) for n in (2, 64)}
    compiles, default_calls = len(calls), dispatcher.default_calls()

    def stand_in(*arguments):
        raise AssertionError("the dispatcher must not call it")

    with dispatcher.stand_in(stand_in):
        assert forgotten == [1]  # the routes forget what they served before
        for problem in (warmed, missed):  # a miss meanwhile compiles nothing either
            # A default bucket, a tuned one, one past the last.
            for tokens in (2, 64, 2 * MAX_BUCKET):
                served = dispatcher.serving(kernel, problem.static_tuple(), tokens)
                bucket = min(tokens, MAX_BUCKET)
                assert served.compiled.function is stand_in
                assert served.compiled.problem.num_tokens == bucket
                assert served.compiled.config == TinyConfig(
                    block=64 if problem is warmed and tokens >= 64 else bucket)
        route_row = dispatcher.serving(kernel, warmed.static_tuple(), 2).route_row
        assert route_row is not None and all(b.function is stand_in for b in route_row)
        assert len(calls) == compiles and dispatcher.default_calls() == default_calls
        with pytest.raises(RuntimeError, match="already serves a stand-in"):
            with dispatcher.stand_in(stand_in):
                pass
    assert forgotten == [1, 1]  # and forget the stand-in's rows
    assert {n: dispatcher.lookup(kernel, warmed.static_tuple(), n) for n in (2, 64)} == before
    assert dispatcher.lookup(kernel, missed.static_tuple(), 64).function is not stand_in
    assert len(calls) > compiles  # the problem missed meanwhile is compiled at its next call


def test_without_a_gpu_the_dispatcher_serves_nothing_and_says_so(monkeypatch):
    from cutetune.serving import warmup

    monkeypatch.setattr(warmup, "_current", None)
    served = warmup.current_dispatcher()
    assert served.spec is None
    assert served.report().startswith("no CUDA device is visible: this dispatcher serves")


def test_a_moe_dispatch_winner_stored_before_its_forms_is_not_misread():
    """Winners stored before moe_dispatch's points came in forms ({"policy": ...,
    "vector_bits": ...}) carry the code hash of that code: they are skipped as stale, never
    parsed as points, and the current winners beside them are served."""
    from cutetune.kernels import moe_dispatch as md

    compiled = []
    kernel = dataclasses.replace(
        md.KERNEL, compile_function=lambda p, c, options="": compiled.append(c) or object())
    (problem,) = kernel.problems_for_model(load_model("qwen3-30b-a3b"), "bfloat16")
    before = dataclasses.replace(
        winner(kernel, problem, 8, kernel.default_config(problem.with_tokens(8), SPEC),
               source_hash="0123456789abcdef"),
        config_json='{"cache_hints": "normal", "grid_blocks": 128, "policy": "replicated", '
                    '"tokens_per_block": 1, "vector_bits": 128, "warps_per_block": 4}')
    current = md.SPACE.config_from_dict({"form": "split", "grid_blocks": 32,
                                         "warps_per_block": 8, "tokens_per_block": 1,
                                         "cache_hints": "streaming"})
    dispatcher = Dispatcher(SPEC, [before, winner(kernel, problem, 4096, current)])
    stats = dispatcher.warmup(kernel, [problem])
    entries = entries_by_bucket(dispatcher)
    assert stats.stale_winners == 1
    assert (entries[4096].source, entries[4096].config) == (TUNED, current)
    assert entries[8].source != TUNED


def test_a_cold_warmup_compiles_in_parallel_and_a_warm_one_loads_every_point(qwen3_8b,
                                                                              tmp_path):
    """Two distinct points (the two winners serve every bucket): compiled by two processes into
    the cache at the first start, loaded from it at the next, and served the same."""
    import os

    from cutetune.build.artifacts import ArtifactStore

    kernel = qk.KERNEL
    stored = [winner(kernel, qwen3_8b, 8, SMALL), winner(kernel, qwen3_8b, 4096, LARGE)]
    arch = os.environ["CUTE_DSL_ARCH"]
    cold = Dispatcher(SPEC, stored, ArtifactStore(tmp_path, arch), compile_processes=2)
    cold_stats = cold.warmup(kernel, [qwen3_8b.with_tokens(1)])
    assert (cold_stats.points, cold_stats.loaded) == (2, 2)  # stored by the pool, then loaded
    # Both processes started and compiled: each sum is above zero.
    assert re.search(r"2 compiled \(0 here in 0\.00 s, 2 in parallel processes in "
                     r"[1-9]\d*\.\d\d s: starting (?!0\.0 )\d+\.\d s, compiling (?!0\.0 )\d+\.\d s "
                     r"over the processes\)", cold.report()), cold.report()

    warm = Dispatcher(SPEC, stored, ArtifactStore(tmp_path, arch), compile_processes=2)
    warm_stats = warm.warmup(kernel, [qwen3_8b])
    assert (warm_stats.points, warm_stats.loaded) == (2, 2)
    assert re.search(r"2 loaded \(\d+\.\d\d s\), 0 compiled \(0 here in 0\.00 s, 0 in "
                     r"parallel processes in 0\.00 s: starting 0\.0 s, compiling 0\.0 s over the "
                     r"processes\), 0 unsound", warm.report()), warm.report()
    assert {e.config for e in entries_by_bucket(warm).values()} == {SMALL, LARGE}
    assert len(ArtifactStore(tmp_path, arch).entries()) == 2


def test_a_winner_measured_under_another_environment_is_served_and_named(qwen3_8b,
                                                                          qk_fake_compile):
    kernel, _ = qk_fake_compile
    elsewhere = dataclasses.replace(winner(kernel, qwen3_8b, 8, SMALL),
                                    measured_elsewhere="torch 2.9.1 (here 2.9.0)")
    dispatcher = Dispatcher(SPEC, [elsewhere, winner(kernel, qwen3_8b, 4096, LARGE)])
    stats = dispatcher.warmup(kernel, [qwen3_8b])
    assert entries_by_bucket(dispatcher)[8].source == TUNED
    assert stats.measured_elsewhere == ("torch 2.9.1 (here 2.9.0)",)
    assert ("1 winners measured under another environment, served: torch 2.9.1 (here 2.9.0)"
            in dispatcher.report())


def test_warmup_imports_no_pandas():
    """The engine's path (the dispatcher and the winners it reads) leaves pandas, which only
    the frames of the reports need, unimported: it costs a warmup a third of a second."""
    import subprocess
    import sys

    script = ("import sys\nimport cutetune.serving.warmup, cutetune.results_db\n"
              "from cutetune.results_db import winners_to_serve\n"
              "print('pandas' in sys.modules)\n")
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           check=True)
    assert shown.stdout.strip() == "False"


def test_an_unwritable_cache_is_warned_about_once_and_points_compile_in_memory(tmp_path,
                                                                               caplog):
    from cutetune.serving.warmup import artifact_store
    from testkit.fake_qk_runner import FINGERPRINT as H200_FINGERPRINT

    blocked = tmp_path / "file"
    blocked.write_text("")
    with caplog.at_level(logging.WARNING, logger="cutetune.serving"):
        assert artifact_store(blocked, H200_FINGERPRINT) is None
        assert artifact_store(blocked, H200_FINGERPRINT) is None
    warnings = [r.getMessage() for r in caplog.records if r.name == "cutetune.serving"]
    assert len(warnings) == 1 and "cannot be written; compiling in memory" in warnings[0]
    store = artifact_store(tmp_path, H200_FINGERPRINT)
    assert store is not None and store.arch == "sm_90a"


def test_without_a_c_compiler_the_cache_is_off_and_says_why(tmp_path, caplog, monkeypatch):
    from cutetune.serving.warmup import artifact_store
    from testkit.fake_qk_runner import FINGERPRINT as H200_FINGERPRINT

    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with caplog.at_level(logging.WARNING, logger="cutetune.serving"):
        assert artifact_store(tmp_path / "cache", H200_FINGERPRINT) is None
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "cutetune.serving"]
    assert "no C compiler found" in warning and warning.endswith("compiling in memory")


def test_shipped_winners_serve_where_the_users_database_has_none(qwen3_8b, qk_fake_compile):
    """The user's winner first, then the shipped one, then the nearest of either, then the
    default; the report says which served each bucket, and counts stale shipped winners."""
    kernel, _ = qk_fake_compile
    yours = [winner(kernel, qwen3_8b, 8, SMALL)]
    shipped = [winner(kernel, qwen3_8b, 8, LARGE), winner(kernel, qwen3_8b, 4096, LARGE),
               winner(kernel, qwen3_8b, 64, SMALL, STALE_HASH)]
    dispatcher = Dispatcher(SPEC, yours, shipped=shipped)
    stats = dispatcher.warmup(kernel, [qwen3_8b])
    entries = entries_by_bucket(dispatcher)
    assert (entries[8].source, entries[8].config) == (TUNED, SMALL)  # yours beats shipped
    assert (entries[4096].source, entries[4096].config) == (SHIPPED, LARGE)
    assert (entries[16].source, entries[16].tuned_bucket) == (NEAREST, 8)
    assert (entries[32768].source, entries[32768].tuned_bucket) == (NEAREST, 4096)
    assert (stats.stale_winners, stats.stale_shipped) == (0, 1)
    report = dispatcher.report()
    assert "tuned buckets 8; shipped 4096;" in report
    assert "0 winners ignored (older kernel source), and 1 shipped ones" in report


def test_warmup_skips_each_unusable_stored_winner_in_one_line(tmp_path, caplog, monkeypatch):
    """A database holding winners today's qk_norm cannot use (a bucket outside the policy, a
    choice its space lacks, a knob it lacks): warmup serves the usable ones, and names each
    other once, with its bucket and why."""
    from cutetune.device.specs import device_spec_for
    from cutetune.results_db import Database, DeviceFingerprint
    from cutetune.results_db.export import check_import
    from cutetune.results_db.queries import record_tuning_results
    from cutetune.serving import warmup
    from testkit.bad_imports import UNUSABLE_REASONS, VALID, unusable_runs, valid_records
    from testkit.fake_qk_runner import FINGERPRINT as H200_FINGERPRINT

    url = f"sqlite:///{tmp_path / 'stored.db'}"
    db = Database.open(url)
    checked = check_import(json.dumps(valid_records()), "json", device_spec_for)
    record_tuning_results(db, [*checked.runs, *unusable_runs()])
    db.dispose()
    # The points are not compiled: which ones would be is the question here.
    monkeypatch.setattr(Dispatcher, "compiled", lambda self, kernel, problem, config: object())
    monkeypatch.setattr(DeviceFingerprint, "current",
                        classmethod(lambda cls, device_index=None: H200_FINGERPRINT))
    monkeypatch.setattr(warmup, "artifact_store", lambda cache_dir, fingerprint: None)
    monkeypatch.setattr(warmup, "load_library", lambda: None)
    monkeypatch.setattr(warmup, "_current", None)
    with caplog.at_level(logging.WARNING, logger="cutetune.serving"):
        served = warmup.warmup("qwen3-8b", kernels=["qk_norm"], db_url=url)
    entries = entries_by_bucket(served)
    for bucket, config in VALID:
        assert (entries[bucket].source, entries[bucket].config) == (TUNED, config)
    assert all(e.config.vector_bits != 7 for e in entries.values())
    lines = [r.getMessage() for r in caplog.records if r.name == "cutetune.serving"]
    for bucket, reason in UNUSABLE_REASONS.items():
        (line,) = [line for line in lines if f"(bucket {bucket}," in line]
        assert line.startswith("cutetune: skipping a stored qk_norm winner") and reason in line
