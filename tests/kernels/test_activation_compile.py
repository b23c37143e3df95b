"""The CI compile checks of the gated activations: the covering points (every pair of knob
values, and the defaults served at every bucket) compile for sm_90a on the CPU for every MLP
width of the public presets (silu_and_mul in bf16, the dtype those models ship in) and for
synthetic problems that add fp16, fp32, both GELU forms, and widths that only 64-bit or 32-bit
vectors divide; the PTX shows the configured vector width, the cache hints and
the fast-math instructions.

No preset uses GELU (gelu_and_mul does not apply to them); the synthetic GELU problems compile
both forms. About 160 compiles at 0.3-0.4 s each; the `sweep` marker compiles every valid
point (about 660: every vector that divides the width, 1, 2 or 4 vectors per thread, three
block sizes, plain or streaming accesses), one test id per problem and cache hint.
"""

import re
from collections import Counter

import pytest

from cutetune.device.specs import DEVICE_SPECS
from cutetune.kernels.activation import (
    GELU_KERNEL,
    SILU_KERNEL,
    ActivationConfig,
    GatedProblem,
    GeluAndMulProblem,
    SiluAndMulProblem,
)
from cutetune.kernels.cache_hints import CACHE_HINTS
from cutetune.spaces.buckets import BUCKETS
from cutetune.spaces.models import PRESETS
from testkit.compile_checks import GLOBAL_ACCESS, assert_points_compile, preset_params, ptx_of
from testkit.covering_points import covering_configs

H200 = DEVICE_SPECS["H200"]


def _kernel(problem: GatedProblem):
    return GELU_KERNEL if isinstance(problem, GeluAndMulProblem) else SILU_KERNEL


SYNTHETIC = [
    # fp16 and fp32 with the two GELU forms (the presets compile bf16 with SiLU): the
    # conversions and the math are independent, so two problems cover the four pairs.
    pytest.param(GeluAndMulProblem(num_tokens=1, dtype="float16", intermediate=6912,
                                   approximate="tanh"), id="gelu-tanh-float16-I6912"),
    pytest.param(GeluAndMulProblem(num_tokens=1, dtype="float32", intermediate=1000,
                                   approximate="none"), id="gelu-none-float32-I1000"),
    # Widths that 128-bit vectors do not divide: 64-bit and 32-bit vectors.
    pytest.param(SiluAndMulProblem(num_tokens=1, dtype="bfloat16", intermediate=1004),
                 id="silu-bfloat16-I1004"),
    pytest.param(SiluAndMulProblem(num_tokens=1, dtype="float16", intermediate=1002),
                 id="silu-float16-I1002"),
    pytest.param(GeluAndMulProblem(num_tokens=1, dtype="float32", intermediate=1001,
                                   approximate="tanh"), id="gelu-tanh-float32-I1001"),
]

SILU_PRESETS = preset_params(SILU_KERNEL, lambda problem: f"I{problem.intermediate}")


def test_sweep_covers_every_preset():
    # Guards the sweep against silently shrinking (e.g. a preset losing its MLP width).
    swept = {p.values[0] for p in SILU_PRESETS}
    for model in PRESETS.values():
        assert set(SILU_KERNEL.problems_for_model(model, "bfloat16")) <= swept


@pytest.mark.parametrize("problem", SILU_PRESETS + SYNTHETIC)
def test_covering_points_compile(problem):
    kernel = _kernel(problem)
    assert_points_compile(kernel, problem, covering_configs(kernel, problem, H200, BUCKETS))


# One test id per problem and cache-hint half of the space, so that `pytest -n 2` balances.
@pytest.mark.sweep
@pytest.mark.parametrize("hints", CACHE_HINTS)
@pytest.mark.parametrize("problem", SILU_PRESETS + SYNTHETIC)
def test_every_valid_point_compiles(problem, hints):
    valid = [c for c in _kernel(problem).space.enumerate(problem, H200).valid
             if c.cache_hints == hints]
    assert valid, f"no valid {hints} point for {problem.describe()}"
    assert_points_compile(_kernel(problem), problem, valid)


# ---------------------------------------------------------------------------------------------
# PTX





def _problem(kind: str, dtype: str, width: int) -> GatedProblem:
    if kind == "silu":
        return SiluAndMulProblem(num_tokens=1, dtype=dtype, intermediate=width)
    return GeluAndMulProblem(num_tokens=1, dtype=dtype, intermediate=width,
                             approximate=kind.removeprefix("gelu-"))


PTX_CASES = [
    # kind, dtype, intermediate, vector_bits, vectors_per_thread, warps_per_block, cache_hints
    ("silu", "bfloat16", 14336, 128, 1, 8, "normal"),
    ("silu", "bfloat16", 14336, 128, 1, 8, "streaming"),
    ("silu", "bfloat16", 14336, 128, 4, 4, "normal"),
    ("silu", "bfloat16", 1004, 64, 2, 1, "streaming"),  # 1004 = 251 x 4: 64-bit at most
    ("silu", "bfloat16", 1002, 32, 4, 1, "normal"),  # 1002 = 501 x 2: 32-bit vectors only
    ("silu", "float32", 14336, 128, 2, 4, "streaming"),
    ("gelu-tanh", "bfloat16", 14336, 128, 2, 8, "normal"),
    ("gelu-none", "float16", 14336, 128, 1, 4, "streaming"),
    ("gelu-none", "float32", 1002, 64, 2, 1, "normal"),
]


@pytest.mark.parametrize(("kind", "dtype", "width", "vector_bits", "per_thread", "warps",
                          "hints"), PTX_CASES,
                         ids=[f"{k}-{d}-I{i}-v{v}-x{n}-w{w}-{h}"
                              for k, d, i, v, n, w, h in PTX_CASES])
def test_ptx_vector_width_hints_and_fast_math(kind, dtype, width, vector_bits, per_thread, warps,
                                              hints, tmp_path, monkeypatch):
    config = ActivationConfig(vector_bits, per_thread, warps, hints)
    problem = _problem(kind, dtype, width)
    ptx = ptx_of(_kernel(problem), problem, config, H200, tmp_path, monkeypatch)

    accesses = GLOBAL_ACCESS.findall(ptx)
    assert len(accesses) == ptx.count("ld.global") + ptx.count("st.global") > 0
    # Streaming: every global access carries .cs (cache streaming); plain: none does.
    streaming = len(re.findall(r"\b(ld|st)\.global\.cs\.", ptx))
    assert streaming == (len(accesses) if hints == "streaming" else 0)
    widths = Counter((op, int(lanes or 1) * int(bits)) for op, lanes, bits in accesses)
    # Every global load and store is exactly one vector of the configured width: nothing
    # split into narrower accesses, nothing wider than the config allows. Per vector: one
    # load of gate, one of up, one store of out.
    assert widths == {("ld", vector_bits): 2 * per_thread, ("st", vector_bits): per_thread}
    if vector_bits == 128:
        assert re.search(r"\bld\.global(\.nc|\.cs)?\.v4\.[bf]32\b", ptx)
        assert re.search(r"\bst\.global(\.cs)?\.v4\.[bf]32\b", ptx)
    else:
        # No 128-bit access anywhere (v4 of 32-bit lanes or v2 of 64-bit lanes).
        assert not re.search(r"(ld|st)\.global(\.\w+)*\.(v4\.[bfsu]32|v2\.[bfsu]64)", ptx)

    # Every load is issued before the first store: one memory round trip per thread.
    assert ptx.rindex("ld.global") < ptx.index("st.global")

    # Fast math: one ex2.approx per element for the sigmoid (SiLU, tanh-GELU) or inside erff;
    # no IEEE division anywhere, and no tanh.approx (too coarse for fp16 near tanh = -1).
    elements = per_thread * vector_bits // (16 if dtype != "float32" else 32)
    assert len(re.findall(r"\bex2\.approx\.ftz\.f32\b", ptx)) == elements
    assert not re.search(r"\bdiv\.(rn|full)\.f32\b", ptx)
    assert "tanh.approx" not in ptx
    reciprocals = len(re.findall(r"\brcp\.approx\.ftz\.f32\b", ptx))
    if kind in ("silu", "gelu-tanh"):
        assert reciprocals == elements
