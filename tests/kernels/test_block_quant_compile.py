"""The CI compile checks of mxfp8_quant and nvfp4_quant: the covering points (every pair of knob
values, and the defaults served at every bucket) compile for sm_90a (H200) and sm_100a (B200,
with the 256-bit loads only it has) on the CPU, for both formats, both scale layouts, both input
dtypes and a width whose scale columns need padding; the PTX shows each target's conversions
(sm_100a: cvt e2m1x2 and e4m3x2; sm_90a: e4m3x2 and e2m1's rounding, one fma an element), the
vector widths and every load issued before the first store. The `sweep` marker compiles every valid
point of each problem on both targets."""

import re

import pytest

from cutetune.device.specs import DEVICE_SPECS
from cutetune.kernels.block_quant import (
    MXFP8_KERNEL,
    NVFP4_KERNEL,
    BlockQuantConfig,
    MXFP8QuantProblem,
    NVFP4QuantProblem,
)
from cutetune.spaces.buckets import BUCKETS
from testkit.compile_checks import GLOBAL_ACCESS, preset_params
from testkit.covering_points import covering_configs
from testkit.every_point import assert_every_point

TARGETS = {"sm_90a": DEVICE_SPECS["H200"], "sm_100a": DEVICE_SPECS["B200"]}
# sm_90a rounds each element to e2m1 with one fma (kernels/device/block_quant.py).
SOFTWARE_E2M1 = re.compile(r"\bfma\.rn\.f32\b")


def _kernel(problem):
    return MXFP8_KERNEL if problem.format == "mxfp8" else NVFP4_KERNEL


PROBLEMS = [
    pytest.param(MXFP8QuantProblem(num_tokens=1, dtype="bfloat16", hidden=4096,
                                   scale_layout="swizzled"), id="mxfp8-bf16-4096-swizzled"),
    pytest.param(MXFP8QuantProblem(num_tokens=1, dtype="float16", hidden=96,
                                   scale_layout="swizzled"), id="mxfp8-fp16-96-swizzled"),
    pytest.param(NVFP4QuantProblem(num_tokens=1, dtype="bfloat16", hidden=14336,
                                   scale_layout="row_major"), id="nvfp4-bf16-14336-row_major"),
    pytest.param(NVFP4QuantProblem(num_tokens=1, dtype="float16", hidden=80,
                                   scale_layout="swizzled"), id="nvfp4-fp16-80-swizzled"),
    *preset_params(NVFP4_KERNEL),
]


@pytest.mark.parametrize("arch", TARGETS)
@pytest.mark.parametrize("problem", PROBLEMS)
def test_covering_points_compile(problem, arch):
    kernel = _kernel(problem)
    configs = covering_configs(kernel, problem, TARGETS[arch], BUCKETS)
    if arch == "sm_100a":
        assert {c.vector_bits for c in configs} == {64, 128, 256}

    def compiles(_, config) -> None:
        if not callable(kernel.compile(problem, config, options=f"--gpu-arch {arch}")):
            raise TypeError("compiled result is not callable")

    assert_every_point(configs, compiles, f"{problem.describe()} on {arch} (compiling)")


@pytest.mark.sweep
@pytest.mark.parametrize("arch", TARGETS)
@pytest.mark.parametrize("problem", PROBLEMS)
def test_every_valid_point_compiles(problem, arch):
    kernel = _kernel(problem)
    valid = kernel.space.enumerate(problem, TARGETS[arch]).valid
    assert len(valid) == (27 if arch == "sm_100a" else 18)
    assert_every_point(valid, lambda _, config: kernel.compile(
        problem, config, options=f"--gpu-arch {arch}"), f"{problem.describe()} on {arch}")


def _ptx(problem, config, arch, tmp_path, monkeypatch) -> str:
    monkeypatch.chdir(tmp_path)
    kernel = _kernel(problem)
    kernel.space.check(problem, config, TARGETS[arch])
    kernel.compile(problem, config, options=f"--gpu-arch {arch} --keep-ptx --dump-dir {tmp_path}")
    (ptx_file,) = tmp_path.glob("*.ptx")
    return ptx_file.read_text()


PTX_CASES = [
    # format, layout, arch, vector_bits, vectors_per_thread
    ("nvfp4", "swizzled", "sm_100a", 256, 2),
    ("nvfp4", "row_major", "sm_100a", 128, 1),
    ("nvfp4", "swizzled", "sm_90a", 128, 2),
    ("nvfp4", "row_major", "sm_90a", 64, 4),
    ("mxfp8", "swizzled", "sm_100a", 256, 1),
    ("mxfp8", "row_major", "sm_90a", 128, 4),
    ("mxfp8", "swizzled", "sm_90a", 64, 1),
]


@pytest.mark.parametrize(("fmt", "layout", "arch", "bits", "per_thread"), PTX_CASES,
                         ids=["-".join(map(str, case)) for case in PTX_CASES])
def test_ptx_conversions_and_vector_widths(fmt, layout, arch, bits, per_thread, tmp_path,
                                           monkeypatch):
    kind = MXFP8QuantProblem if fmt == "mxfp8" else NVFP4QuantProblem
    problem = kind(num_tokens=1, dtype="bfloat16", hidden=4096, scale_layout=layout)
    ptx = _ptx(problem, BlockQuantConfig(bits, per_thread, 4), arch, tmp_path, monkeypatch)
    elements = per_thread * bits // 16
    e2m1 = len(re.findall(r"\bcvt\.rn\.satfinite\.e2m1x2\.f32\b", ptx))
    e4m3 = len(re.findall(r"\bcvt\.rn\.satfinite\.e4m3x2\.f32\b", ptx))
    if fmt == "nvfp4":
        # One e4m3 conversion per vector (its block's scale); e2m1 by hardware on sm_100a, by
        # one fma an element on sm_90a, which has no such instruction.
        assert e4m3 == per_thread
        software = len(SOFTWARE_E2M1.findall(ptx))
        if arch == "sm_100a":
            assert e2m1 == elements // 2 and software == 0
        else:
            assert e2m1 == 0 and software == elements
        # Both divisions of the scale math are IEEE (div.rn), none approximate.
        assert len(re.findall(r"\bdiv\.rn\.f32\b", ptx)) == 2 * per_thread
        assert not re.search(r"\b(div\.(approx|full)|rcp\.approx)", ptx)
    else:
        assert e4m3 == elements // 2 and e2m1 == 0
    # No flush to zero: denormal inputs are scaled exactly.
    assert not re.search(r"\bmul\.(rn\.)?ftz\.f32\b", ptx)
    loads = [(int(lanes or 1) * int(width)) for op, lanes, width in GLOBAL_ACCESS.findall(ptx)
             if op == "ld"]
    x_loads = [b for b in loads if b > 32]  # the global scale is one 32-bit load
    assert x_loads and set(x_loads) == {bits}
    if bits == 256:
        assert "ld.global.v8.b32" in ptx
    # Every load of x is issued before the first store.
    assert ptx.rindex("ld.global.v") < ptx.index("st.global")
