"""GPU timing: CUDA-graph replay timed with events, over rotated input sets.

Many launches are captured in one graph so launch gaps shrink to what an engine running graphs
sees; the graph cycles through enough input sets that a large problem's working set exceeds
3x the L2 and runs cold-cache, as it does in a model where other layers evict it. Outputs are
allocated per call (with_fresh_outputs), as an engine's and every peer's are.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

# Repeats of the whole graph; the median and IQR are over these.
REPEATS = 25
# time_interleaved's rounds: every graph is replayed REPEATS // ROUNDS times per round.
INTERLEAVED_ROUNDS = 5
WARMUP_REPLAYS = 3
# Aim for graphs of about this long so event resolution (~0.5 us) stays negligible.
TARGET_GRAPH_US = 2000.0
MAX_LAUNCHES_PER_GRAPH = 2000
MAX_INPUT_SETS = 64
MAX_ROTATION_BYTES = 8 * 2**30
# A decode-sized point takes about a microsecond, and the GPU's state moves such a time from one
# moment to the next at the same SM clock by more than such points differ (measured on the
# H200: docs/performance-notes.md, Measuring). Below this time the tuner times each trial
# between two timings of a fixed reference point (the heuristic default) and corrects it by the
# reference's drift since its first timing (tuner/trials.py), so trials taken at different
# moments of a search compare.
DRIFT_CORRECTED_BELOW_US = 5.0


@dataclass(frozen=True)
class Measurement:
    median_us: float
    iqr_us: float
    repeats: int


def summarise(per_call_us: Sequence[float]) -> Measurement:
    ordered = sorted(per_call_us)
    n = len(ordered)

    def quantile(q: float) -> float:
        position = q * (n - 1)
        low, high = math.floor(position), math.ceil(position)
        return ordered[low] + (ordered[high] - ordered[low]) * (position - low)

    return Measurement(quantile(0.5), quantile(0.75) - quantile(0.25), n)


def input_sets_for(working_set_bytes: int, l2_bytes: int) -> int:
    """How many input sets make the rotation exceed 3x L2 (within memory and graph limits)."""
    wanted = math.ceil(3 * l2_bytes / max(working_set_bytes, 1))
    by_memory = max(1, MAX_ROTATION_BYTES // max(working_set_bytes, 1))
    return max(1, min(wanted, MAX_INPUT_SETS, by_memory))


def time_events(fn: Callable[[], None], repeats: int = REPEATS) -> list[float]:
    """Per-call microseconds of `fn` (already warm), each timed with its own event pair."""
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return times


def with_fresh_outputs(tensors: Mapping[str, torch.Tensor], outputs: Sequence[str],
                       written_in_place: Sequence[str]) -> dict[str, torch.Tensor]:
    """`tensors` with each of `outputs` not written in place replaced by a new uninitialised
    tensor of its shape and strides, allocated now: padded or transposed outputs keep the
    layout the kernel was given (the column-major FP8 scales, padded to four tokens, as the ops
    allocate them), where torch.empty_like would make a non-dense one contiguous.

    Ours is timed this way because every peer, torch itself and an engine allocate outputs per
    call: in a CUDA graph each replay of such a call writes the same pool block, which stays
    in L2, while an output kept with its input set is cold. Timing ours with kept outputs
    favours every peer (measured on the H200: docs/performance-notes.md, Measuring)."""
    fresh = dict(tensors)
    for name in outputs:
        if name not in written_in_place:
            given = tensors[name]
            fresh[name] = torch.empty_strided(given.shape, given.stride(), dtype=given.dtype,
                                              device=given.device)
    return fresh


@dataclass(frozen=True)
class _CapturedGraph:
    graph: torch.cuda.CUDAGraph
    calls: int  # launches per replay


def _capture(launches: Sequence[Callable[[], None]]) -> _CapturedGraph:
    """Calls captured round-robin into one CUDA graph of about TARGET_GRAPH_US, warmed up."""
    for launch in launches:  # compile-time, module-load and allocator work stay out of capture
        launch()
    torch.cuda.synchronize()
    probe = time_events(lambda: [launch() for launch in launches], repeats=3)
    per_call = max(min(probe) / len(launches), 0.5)
    count = min(MAX_LAUNCHES_PER_GRAPH, max(len(launches), math.ceil(TARGET_GRAPH_US / per_call)))
    count = math.ceil(count / len(launches)) * len(launches)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            for i in range(count):
                launches[i % len(launches)]()
    torch.cuda.synchronize()
    for _ in range(WARMUP_REPLAYS):
        graph.replay()
    torch.cuda.synchronize()
    return _CapturedGraph(graph, count)


def _per_call_us(captured: _CapturedGraph, repeats: int) -> list[float]:
    return [t / captured.calls for t in time_events(captured.graph.replay, repeats)]


def time_in_graph(launches: Sequence[Callable[[], None]],
                  repeats: int = REPEATS) -> Measurement:
    """Per-launch time of calls captured round-robin into one CUDA graph.

    `launches` are closures, one per input set; each must run on torch's current stream."""
    return summarise(_per_call_us(_capture(launches), repeats))


def time_interleaved(launch_sets: Sequence[Sequence[Callable[[], None]]],
                     rounds: int = INTERLEAVED_ROUNDS,
                     repeats: int = REPEATS) -> list[Measurement]:
    """time_in_graph of each of `launch_sets`, but with every graph captured first and then
    replayed in `rounds` rounds, each replaying every graph in turn, so that a slow spell of
    the GPU falls on all of them alike. At decode sizes the same point reads slower at one
    moment than at another on the H200, by more than candidates differ
    (docs/performance-notes.md, Measuring)."""
    return [summarise(times) for times in _interleaved_per_call(launch_sets, rounds, repeats)]


def time_interleaved_draws(draw: Callable[[], Sequence[Sequence[Callable[[], None]]]],
                           draws: int, rounds: int = INTERLEAVED_ROUNDS,
                           repeats: int = REPEATS) -> list[Measurement]:
    """time_interleaved of the launch sets `draw()` makes, `draws` times (each draw on inputs
    allocated afresh, at other addresses), each candidate's per-call times pooled over the
    draws: its median and IQR then span what the placement of its inputs in memory moves, as
    the inputs of another run would sit elsewhere (tuner/finals.py says why)."""
    pooled: list[list[float]] | None = None
    for _ in range(draws):
        times = _interleaved_per_call(draw(), rounds, repeats)
        pooled = times if pooled is None else [a + b for a, b in zip(pooled, times, strict=True)]
    return [summarise(times) for times in pooled or []]


def _interleaved_per_call(launch_sets: Sequence[Sequence[Callable[[], None]]], rounds: int,
                          repeats: int) -> list[list[float]]:
    captured = [_capture(launches) for launches in launch_sets]
    per_call: list[list[float]] = [[] for _ in captured]
    for _ in range(rounds):
        for graph, times in zip(captured, per_call, strict=True):
            times += _per_call_us(graph, max(1, repeats // rounds))
    return per_call
