"""`cutetune bench` on the CPU: which candidates a problem gets, and how rows are summarised.

Timing needs a GPU (tests/gpu/test_bench_gpu.py); here the qk_norm candidates compile for
sm_90a, and the peers' libraries are absent, so they must say so rather than vanish; the
fallback from interleaved timing to one candidate at a time runs with the timing faked.
"""

from __future__ import annotations

import pytest
import torch

from cutetune import bench
from cutetune.bench import (
    COPY_NAME,
    DEFAULT_NAME,
    TUNED_NAME,
    BenchRow,
    candidates,
    speedup_over_best_peer,
)
from cutetune.build.compiled import CompiledPoints
from cutetune.device.measure import Measurement
from cutetune.device.specs import DEVICE_SPECS
from cutetune.kernels import qk_norm as qk
from cutetune.serving.plan import ServingPlan
from cutetune.spaces.models import load_model
from cutetune.spaces.space import config_to_json
from testkit.stored_winners import winner

SPEC = DEVICE_SPECS["H200"]
TUNED = qk.QKNormConfig(vector_bits=64, heads_per_warp=2, warps_per_block=2)


@pytest.fixture(scope="module")
def problem() -> qk.QKNormProblem:
    (static,) = qk.problems_for_model(load_model("qwen3-8b"), "bfloat16")
    return static.with_tokens(8)


def names_and_notes(found):
    return {c.name: (c.run is not None, c.note) for c in found}


def test_without_a_winner_the_tuned_row_says_why_and_the_default_still_runs(problem):
    found = names_and_notes(candidates(qk.KERNEL, problem, ServingPlan(SPEC), CompiledPoints()))
    assert list(found)[:4] == [TUNED_NAME, DEFAULT_NAME, "torch eager", "torch.compile"]
    assert found[TUNED_NAME] == (False, "no winner stored for bucket 8 on this device "
                                        "(cutetune tune first)")
    default = qk.default_config(problem, SPEC)
    assert found[DEFAULT_NAME] == (True, config_to_json(default))


def test_a_stored_winner_is_benched_and_a_nearest_one_is_labelled(problem):
    plan, points = ServingPlan(SPEC, [winner(qk.KERNEL, problem, 8, TUNED)]), CompiledPoints()
    found = names_and_notes(candidates(qk.KERNEL, problem, plan, points))
    assert found[TUNED_NAME] == (True, config_to_json(TUNED))
    found = names_and_notes(candidates(qk.KERNEL, problem.with_tokens(16), plan, points))
    assert found[TUNED_NAME] == (True, config_to_json(TUNED) + " (winner of bucket 8)")


def test_missing_peer_libraries_are_listed_with_the_reason(problem):
    pytest.importorskip("torch")
    try:
        import quack  # noqa: F401
        pytest.skip("quack is installed here")
    except ImportError:
        pass
    found = names_and_notes(candidates(qk.KERNEL, problem, ServingPlan(SPEC), CompiledPoints()))
    ran, note = found["quack rmsnorm x2"]
    assert not ran and note.startswith("not run: quack is not installed")


def row(problem, name, us):
    return BenchRow(problem, name, us, 0.01 if us else None, 1.0 if us else None,
                    1.0 if us else None, "" if us else "not run: missing")


def test_speedup_is_best_peer_over_tuned_or_else_default(problem):
    rows = [row(problem, TUNED_NAME, 2.0), row(problem, DEFAULT_NAME, 3.0),
            row(problem, "torch eager", 8.0), row(problem, "quack", 5.0),
            row(problem, "liger", None), row(problem, COPY_NAME, 1.0)]
    assert speedup_over_best_peer(rows) == pytest.approx(2.5)
    assert speedup_over_best_peer(rows[1:]) == pytest.approx(5.0 / 3.0)
    assert speedup_over_best_peer(rows[:2]) is None


def test_a_fused_kernel_is_benched_beside_its_unfused_chain_of_our_kernels(monkeypatch):
    """The chain runs each step as the plan serves it, on the tensors the steps before it
    wrote: here each step's point stands in as its kernel's reference, so the chain must equal
    the fused kernel's reference."""
    import torch

    from cutetune import bench
    from cutetune.kernels import qk_norm_rope
    from cutetune.kernels.dtypes import TORCH_DTYPES

    served = []

    def reference_runner(kernel, problem, config, points):
        served.append((kernel.name, problem, config))

        def run(tensors):
            expected = kernel.reference(tensors, problem)
            for name in kernel.outputs:  # in place, as the kernels write q and k
                tensors[name].copy_(expected[name].to(TORCH_DTYPES[problem.dtype]))
            return {name: tensors[name] for name in kernel.outputs}
        return run

    monkeypatch.setattr(bench, "ours_runner", reference_runner)
    (static,) = qk_norm_rope.problems_for_model(load_model("qwen3-8b"), "bfloat16")
    problem = static.with_tokens(5)
    found = {c.name: c for c in candidates(qk_norm_rope.KERNEL, problem, ServingPlan(SPEC),
                                           CompiledPoints())}
    chain = found["cutetune unfused: qk_norm + rope"]
    # qk_norm's store rounds the normed heads, which the fused kernel rotates unrounded.
    assert chain.roundings == 2
    norm, rotation = problem.norm, problem.rotation
    assert [(name, p) for name, p, _ in served[-2:]] == [("qk_norm", norm),
                                                         ("rope", rotation)]
    assert chain.note == (f"qk_norm {config_to_json(served[-2][2])}; rope "
                          f"{config_to_json(served[-1][2])}")
    inputs = qk_norm_rope.make_inputs(problem, "cpu", torch.Generator().manual_seed(3))
    expected = qk_norm_rope.reference(inputs, problem)
    outputs = chain.run(qk_norm_rope.make_inputs(problem, "cpu",
                                                 torch.Generator().manual_seed(3)))
    for name in ("q", "k"):
        torch.testing.assert_close(outputs[name].float(), expected[name], rtol=2e-2, atol=2e-2)


def test_candidates_whose_graphs_do_not_fit_together_are_timed_apart(monkeypatch):
    """Interleaved timing that runs out of GPU memory falls back to one candidate at a time,
    saying so in each row's note; a candidate whose graph alone does not fit is not timed
    and says why; the others keep their times."""
    def interleaved(launch_sets):
        raise torch.OutOfMemoryError("CUDA out of memory")

    def alone(launches):
        if launches[0]() == "huge":
            raise torch.OutOfMemoryError("CUDA out of memory")
        return Measurement(float(launches[0]()), 0.0, 3)

    monkeypatch.setattr(bench, "time_interleaved", interleaved)
    monkeypatch.setattr(bench, "time_in_graph", alone)
    timings = bench.time_candidates([[lambda: 2], [lambda: "huge"], [lambda: 5]])
    assert timings == [(Measurement(2.0, 0.0, 3), bench.APART), (None, bench.ALONE_TOO_LARGE),
                       (Measurement(5.0, 0.0, 3), bench.APART)]


def test_candidates_that_fit_together_are_timed_interleaved_without_a_note(monkeypatch):
    monkeypatch.setattr(bench, "time_interleaved",
                        lambda sets: [Measurement(float(s[0]()), 0.0, 3) for s in sets])
    monkeypatch.setattr(bench, "time_in_graph", lambda launches: pytest.fail("timed apart"))
    assert bench.time_candidates([[lambda: 1], [lambda: 4]]) == [
        (Measurement(1.0, 0.0, 3), ""), (Measurement(4.0, 0.0, 3), "")]
