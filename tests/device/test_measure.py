"""Output placement and the order of interleaved timing, on the CPU (the timing itself needs a
GPU)."""

import dataclasses
from types import SimpleNamespace

import torch

from cutetune.bench import ours_runner
from cutetune.device import measure
from cutetune.device.measure import with_fresh_outputs
from cutetune.kernels import rmsnorm as rms


def test_outputs_not_written_in_place_are_new_tensors_of_the_same_shape():
    tensors = {"x": torch.ones(3, 4), "out": torch.zeros(3, 4, dtype=torch.bfloat16),
               "residual": torch.ones(3, 4)}
    fresh = with_fresh_outputs(tensors, ("out", "residual"), ("residual",))
    assert fresh["out"] is not tensors["out"]
    assert (fresh["out"].shape, fresh["out"].dtype) == ((3, 4), torch.bfloat16)
    # Inputs and in-place outputs stay the caller's; the caller's dict is not changed.
    assert fresh["x"] is tensors["x"] and fresh["residual"] is tensors["residual"]
    assert set(fresh) == set(tensors) and (tensors["out"] == 0).all()


def test_fresh_outputs_keep_the_layout_of_a_padded_transposed_output():
    # Column-major scales of 5 tokens with the token stride padded to 8, as the kernel takes
    # them: their transpose, (groups, tokens) rows 8 apart.
    scales = torch.empty_strided((5, 3), (1, 8)).t()
    fresh = with_fresh_outputs({"scales": scales}, ("scales",), ())["scales"]
    assert fresh is not scales
    assert (fresh.shape, fresh.stride()) == ((3, 5), (8, 1))


class _StubPoints:
    def get(self, kernel, problem, config):
        return "compiled"


def test_bench_runs_ours_into_outputs_allocated_per_call():
    problem = rms.RMSNormProblem(num_tokens=2, dtype="bfloat16", out_dtype="bfloat16",
                                 hidden=256, eps=1e-6, weight_bias=0.0, fused_add=True)
    launched = []

    def launch(compiled, tensors):
        tensors["out"].fill_(7.0)
        launched.append(tensors)

    kernel = dataclasses.replace(rms.KERNEL, launch=launch)
    run = ours_runner(kernel, problem, rms.default_config, _StubPoints())
    tensors = rms.make_inputs(problem, "cpu", torch.Generator().manual_seed(0))
    first, second = run(tensors), run(tensors)
    assert first["out"] is launched[0]["out"] and (first["out"] == 7.0).all()
    assert first["out"] is not tensors["out"] and second["out"] is not first["out"]
    assert first["residual"] is tensors["residual"]  # fused add: the caller's, in place


def test_time_interleaved_replays_every_graph_in_turn_each_round(monkeypatch):
    # The graphs stand in as names; each replay "takes" a time that depends on the round, as a
    # slow spell of the GPU would: interleaving gives every set the same spells.
    captured, replayed = [], []

    def capture(launches):
        captured.append(launches)
        return measure._CapturedGraph(graph=SimpleNamespace(replay=launches[0]), calls=2)

    def time_events(fn, repeats):
        replayed.append((fn(), repeats))
        slow_spell = 10.0 if len(replayed) > 4 else 0.0
        return [fn_time + slow_spell for fn_time in [4.0] * repeats]

    monkeypatch.setattr(measure, "_capture", capture)
    monkeypatch.setattr(measure, "time_events", time_events)
    a, b = [lambda: "a"], [lambda: "b"]
    first, second = measure.time_interleaved([a, b], rounds=3, repeats=6)
    assert captured == [a, b]  # every graph captured once, before any is timed
    assert replayed == [("a", 2), ("b", 2)] * 3
    # Per call: graph time over its 2 calls; both sets saw 4 fast and 2 slow replays.
    assert first == second
    assert (first.median_us, first.repeats) == (2.0, 6)


def test_time_interleaved_draws_pools_each_candidates_times_over_fresh_draws(monkeypatch):
    # Each draw makes its own launch sets (inputs allocated afresh); a candidate's times from
    # every draw go into one measurement, so a draw that placed it badly widens its IQR.
    draws = []

    def draw():
        n = len(draws)
        draws.append(n)
        return [[lambda n=n: ("a", n)], [lambda n=n: ("b", n)]]

    def capture(launches):
        return measure._CapturedGraph(graph=SimpleNamespace(replay=launches[0]), calls=1)

    def time_events(fn, repeats):
        name, n = fn()
        return [{"a": 2.0, "b": 3.0}[name] + (4.0 if n == 2 else 0.0)] * repeats

    monkeypatch.setattr(measure, "_capture", capture)
    monkeypatch.setattr(measure, "time_events", time_events)
    first, second = measure.time_interleaved_draws(draw, 3, rounds=2, repeats=4)
    assert draws == [0, 1, 2]
    assert first.repeats == second.repeats == 12
    # Two draws at 2.0 and one at 6.0 for a: median 2.0, the third draw in its IQR.
    assert (first.median_us, second.median_us) == (2.0, 3.0)
    assert first.iqr_us == second.iqr_us == 4.0
