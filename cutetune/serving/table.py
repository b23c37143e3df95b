"""The serving table: the Dispatcher, built at warmup, then served by token bucket.

Warmup builds, for each static problem, one immutable row of compiled kernels indexed by token
bucket, of the points the serving plan (cutetune.serving.plan) names. A call for a static
problem that was never warmed up is a miss: its row is built from the plan, the miss is logged
once, and the calls the default serves are counted, so `report()` shows what ran untuned.

Every point is loaded from the artifact cache where it is stored there, and otherwise compiled
and stored for the next start; at warmup, the points missing from the cache are compiled first
in parallel processes (one per CPU at most), so that a cold start costs the slowest compiles,
not their sum.

The ops' fast path (cutetune.fast_path): an op's checked path (cutetune.ops.serve: its full
input checks, then `serving`) is given the kernel that serves the call and the row of kernels its
route may serve for the static problem, which it gives the route with the call's arguments, so
that later calls with the same key go from the route straight to the compiled kernel. The
dispatcher never sees an op's arguments. The kernel checks its own arguments before it launches
(TVM-FFI: each tensor's dtype, shape, strides, alignment and device against what it was compiled
for), so a call it accepts is one it computes correctly; a call it refuses goes down the checked
path, whose error names the fault. Calls served by the default, with no tokens or beyond the
largest bucket always take the checked path, so `report()` counts them.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from cutetune.build.artifacts import ArtifactStore
from cutetune.build.compiled import CompiledPoints, compile_here
from cutetune.fast_path import forget_all
from cutetune.kernels.registry import KernelDef
from cutetune.serving.plan import (
    BORROWED,
    DEFAULT,
    NEAREST,
    PREDICTED,
    SHIPPED,
    TUNED,
    BucketEntry,
    ServingPlan,
    say_skipped,
)
from cutetune.serving.precompile import ParallelCompiles, precompile
from cutetune.serving.predicted import PICKS_FILE
from cutetune.spaces.buckets import BUCKETS, MAX_BUCKET, bucket_index
from cutetune.spaces.problem import Problem

log = logging.getLogger("cutetune.serving")

@dataclass(frozen=True)
class ProblemTable:
    kernel: str
    problem: Problem
    entries: tuple[BucketEntry, ...]
    warmed_up: bool


@dataclass(frozen=True)
class Served:
    """What serves one call: `compiled`, the kernel of its bucket, and `route_row`, what the op's
    route may serve for later calls of its static problem (the kernel of each bucket, None where
    the default serves it), or None where this call must not teach the route (the default
    serves it, or it has more tokens than the largest bucket: such calls are counted)."""

    compiled: Any
    route_row: tuple[Any, ...] | None


@dataclass(frozen=True)
class WarmupStats:
    """`points`: the distinct points made ready; of them `loaded` came from the artifact
    cache."""

    seconds: float
    problems: int
    points: int
    loaded: int
    stale_winners: int
    stale_shipped: int
    # The current winners measured where the driver, CUDA runtime or torch differed, by how.
    measured_elsewhere: tuple[str, ...] = ()


class Dispatcher:
    def __init__(self, spec, winners: Iterable[Any] = (), store: ArtifactStore | None = None,
                 compile_processes: int = 0, shipped: Iterable[Any] = (),
                 calibrated: Any = None):
        """`spec`: the DeviceSpec of the GPU in use (None where no GPU is visible: the
        dispatcher then serves nothing and its report says so); `winners`: results_db Winner
        records this device may serve (results_db.winners_to_serve; empty: every call runs
        the heuristic default);
        `store`: the artifact cache points are loaded from and stored to (None: compiled in
        memory); `compile_processes`: at most this many processes compile a warmup's missing
        points in parallel (0 or 1: this process compiles them, one after another);
        `shipped`: the winners shipped with the package (results_db.shipped_winners), served
        where `winners` has none for the bucket; `calibrated`: the device's calibrated cost
        model (results_db.calibration_to_serve_at), whose predicted-best point serves, in the
        problems warmed up, what no winner covers (None: the heuristic default does)."""
        self.spec = spec
        self.plan = ServingPlan(spec, winners, shipped, on_rejected=say_skipped,
                                calibrated=calibrated,
                                picks_file=None if store is None else store.directory / PICKS_FILE)
        self.store = store
        self.compile_processes = compile_processes
        self._parallel = ParallelCompiles()
        self._compiled = CompiledPoints(compile_here if store is None else store.get)
        self._rows: dict[tuple[str, tuple], tuple[Any, ...]] = {}
        self._tables: dict[tuple[str, tuple], ProblemTable] = {}
        self._kernels: dict[str, KernelDef] = {}  # of the rows, by name
        self._default_calls: Counter[tuple[str, tuple, int]] = Counter()
        self._beyond_calls: Counter[tuple[str, tuple]] = Counter()
        self.stats: dict[str, WarmupStats] = {}
        self._stand_in: Any = None  # what serves every bucket meanwhile (`stand_in`)

    # -- building -------------------------------------------------------------------------

    def _table(self, kernel: KernelDef, problem: Problem, warmed_up: bool) -> ProblemTable:
        return ProblemTable(kernel.name, problem.with_tokens(1),
                            self.plan.entries(kernel, problem, at_warmup=warmed_up), warmed_up)

    def compiled(self, kernel: KernelDef, problem: Problem, config: Any):
        """The compiled kernel of one point, made ready once per process and dispatcher: loaded
        from the artifact cache, else compiled (and stored there)."""
        return self._compiled.get(kernel, problem, config)

    def _install(self, kernel: KernelDef, problem: Problem, warmed_up: bool,
                 key: tuple[str, tuple]) -> tuple[Any, ...]:
        table = self._table(kernel, problem, warmed_up)
        if self._stand_in is None:
            row = tuple((self.compiled(kernel, problem, e.config), e.source == DEFAULT)
                        for e in table.entries)
        else:
            row = self._stand_in_row(kernel, table)
        self._kernels[kernel.name] = kernel
        self._tables[key] = table
        self._rows[key] = row
        return row

    def _stand_in_row(self, kernel: KernelDef, table: ProblemTable) -> tuple[Any, ...]:
        return tuple((kernel.bound(table.problem.with_tokens(e.bucket), e.config,
                                   self._stand_in), False) for e in table.entries)

    @contextlib.contextmanager
    def stand_in(self, function: Any) -> Iterator[None]:
        """The seam for measuring host time (benchmarks/op_host_overhead.py,
        benchmarks/fast_path_host.py): meanwhile `function` serves every bucket of every static
        problem, those warmed up and those a miss installs (nothing is compiled for them),
        made into what each kernel's launch takes (`KernelDef.bound`) and served as tuned, so
        the ops' routes serve it too and the default's calls are not counted. On entry and on
        exit the routes forget their rows: each op's next call takes the checked path, which
        tells its route the row served then. On exit the rows served before come back (a
        problem first installed meanwhile is a miss again at its next call).

        `function` takes a kernel's launch arguments (a TVM-FFI function such as
        `cutetune.fast_path.do_nothing()`, for the routes to call it)."""
        if self._stand_in is not None:
            raise RuntimeError("this dispatcher already serves a stand-in")
        before = dict(self._rows)
        self._stand_in = function
        try:
            for key in before:
                self._rows[key] = self._stand_in_row(self._kernels[key[0]], self._tables[key])
            forget_all()
            yield
        finally:
            self._stand_in = None
            self._rows.clear()
            self._rows.update(before)
            forget_all()

    def warmup(self, kernel: KernelDef, problems: Iterable[Problem]) -> WarmupStats:
        """Make ready what each static problem will serve, before the first call."""
        return self.warmup_all([(kernel, list(problems))])[kernel.name]

    def warmup_all(self, work: Sequence[tuple[KernelDef, Sequence[Problem]]]
                   ) -> dict[str, WarmupStats]:
        """`warmup` of several kernels, their missing points compiled in parallel together."""
        if self.store is not None and self.compile_processes > 1:
            precompile(self.plan, self.store, work, self.compile_processes, self._parallel)
        stats = {kernel.name: self._warm(kernel, list(problems)) for kernel, problems in work}
        self.plan.save_picks()
        return stats

    def _warm(self, kernel: KernelDef, problems: list[Problem]) -> WarmupStats:
        start = time.perf_counter()
        compiled_before = len(self._compiled)
        loaded_before = self.store.counts.loaded if self.store is not None else 0
        for problem in problems:
            self._install(kernel, problem, True, (kernel.name, problem.static_tuple()))
        source = kernel.source_hash()
        served = [w for problem in problems
                  for w in self.plan.winners.get((kernel.name, problem.static_key()), ())]
        shipped = [w for problem in problems
                   for w in self.plan.shipped.get((kernel.name, problem.static_key()), ())]
        stale = sum(1 for w in served if w.source_hash != source)
        stale_shipped = sum(1 for w in shipped if w.source_hash != source)
        elsewhere = tuple(w.measured_elsewhere for w in served + shipped
                          if w.source_hash == source and w.measured_elsewhere)
        loaded = (self.store.counts.loaded if self.store is not None else 0) - loaded_before
        self.stats[kernel.name] = WarmupStats(time.perf_counter() - start, len(problems),
                                              len(self._compiled) - compiled_before, loaded,
                                              stale, stale_shipped, elsewhere)
        return self.stats[kernel.name]

    # -- serving (hot path) ---------------------------------------------------------------

    def lookup(self, kernel: KernelDef, static_tuple: tuple, num_tokens: int):
        """The compiled kernel for a call of the problem whose `static_tuple` this is (the
        ops build it with `Problem.static_tuple_of`); the problem itself is built only on a
        miss."""
        row, index = self._served_row(kernel, static_tuple, num_tokens)
        return row[index][0]

    def serving(self, kernel: KernelDef, static_tuple: tuple, num_tokens: int) -> Served:
        """`lookup`'s kernel, and the row the op's route may serve later calls of the problem
        from (cutetune.ops.serve gives it to the route)."""
        row, index = self._served_row(kernel, static_tuple, num_tokens)
        compiled, is_default = row[index]
        if is_default or num_tokens > MAX_BUCKET:
            return Served(compiled, None)
        return Served(compiled, tuple(None if default else served for served, default in row))

    def _served_row(self, kernel: KernelDef, static_tuple: tuple,
                    num_tokens: int) -> tuple[tuple[Any, ...], int]:
        """The problem's row (installed on a miss) and the index of the call's bucket in it; the
        call counted where the default serves it or it is beyond the largest bucket."""
        key = (kernel.name, static_tuple)
        row = self._rows.get(key)
        if row is None:
            problem = kernel.problem_type.from_static_tuple(static_tuple, num_tokens)
            log.warning("cutetune: %s %s was not warmed up; serving the heuristic default "
                        "(run cutetune tune, then warmup)", kernel.name, problem.describe())
            row = self._install(kernel, problem, False, key)
        index = bucket_index(num_tokens)
        if row[index][1]:
            self._default_calls[(kernel.name, static_tuple, BUCKETS[index])] += 1
        if num_tokens > MAX_BUCKET:  # served by the largest bucket, and said so in the report
            self._beyond_calls[key] += 1
        return row, index

    # -- reporting ------------------------------------------------------------------------

    def cache_summary(self) -> str:
        """Where this dispatcher's points came from and what each way took: loaded from the
        artifact cache, compiled here, or compiled in parallel processes (their pool's wall
        time, its start included, then the seconds its processes spent starting and compiling,
        each summed over processes)."""
        if self.store is None:
            return "no artifact cache: every point compiled in memory"
        counts = self.store.counts
        parallel = self._parallel
        return (f"artifact cache {self.store.directory}: {counts.loaded} loaded "
                f"({counts.load_s:.2f} s), {counts.compiled + parallel.compiled} compiled "
                f"({counts.compiled} here in {counts.compile_s:.2f} s, "
                f"{parallel.compiled} in parallel processes in "
                f"{parallel.seconds:.2f} s: starting {parallel.start_cpu_s:.1f} s, "
                f"compiling {parallel.compile_cpu_s:.1f} s over the processes), "
                f"{counts.unsound} unsound files compiled again")

    def tables(self) -> list[ProblemTable]:
        return list(self._tables.values())

    def default_calls(self) -> dict[tuple[str, tuple, int], int]:
        return dict(self._default_calls)

    def beyond_calls(self) -> dict[tuple[str, tuple], int]:
        """Calls with more tokens than the largest bucket, by (kernel, static tuple)."""
        return dict(self._beyond_calls)

    def report(self) -> str:
        if self.spec is None:
            return ("no CUDA device is visible: this dispatcher serves no kernel (the ops compute "
                    "CPU tensors with their kernels' fp32 references)")
        lines = [f"warmup of {name}: {st.problems} problems, {st.points} points "
                 f"({st.loaded} from the artifact cache) in {st.seconds:.2f} s; "
                 f"{st.stale_winners} winners ignored (older kernel source)"
                 + (f", and {st.stale_shipped} shipped ones" if st.stale_shipped else "")
                 + (f"; {len(st.measured_elsewhere)} winners measured under another "
                    f"environment, served: {'; '.join(sorted(set(st.measured_elsewhere)))}"
                    if st.measured_elsewhere else "")
                 for name, st in self.stats.items()]
        lines.append(self.cache_summary())
        for (name, static_tuple), table in self._tables.items():
            by_source: dict[str, list[int]] = {TUNED: [], SHIPPED: [], NEAREST: [],
                                               BORROWED: [], PREDICTED: [], DEFAULT: []}
            for entry in table.entries:
                by_source[entry.source].append(entry.bucket)
            calls = sum(n for (k, s, _), n in self._default_calls.items()
                        if (k, s) == (name, static_tuple))
            state = "warmed up" if table.warmed_up else "NOT warmed up (miss)"
            beyond = self._beyond_calls[(name, static_tuple)]
            lines.append(
                f"{name} {table.problem.describe()}: {state}; tuned buckets "
                f"{_ranges(by_source[TUNED])}; shipped {_ranges(by_source[SHIPPED])}; "
                f"nearest-tuned {_ranges(by_source[NEAREST])}; "
                f"borrowed {_ranges(by_source[BORROWED])}; "
                f"predicted {_ranges(by_source[PREDICTED])}; "
                f"default {_ranges(by_source[DEFAULT])}; calls served by default: {calls}"
                + (f"; calls beyond {MAX_BUCKET} tokens, served by that bucket: {beyond}"
                   if beyond else ""))
        return "\n".join(lines) if lines else "nothing warmed up or served yet"


def _ranges(buckets: list[int]) -> str:
    if not buckets:
        return "none"
    contiguous = all(b == 2 * a for a, b in zip(buckets, buckets[1:], strict=False))
    if len(buckets) <= 4 or not contiguous:
        return ",".join(str(b) for b in buckets)
    return f"{buckets[0]}..{buckets[-1]} ({len(buckets)})"
