"""Block-scaled quantisation of activations for Blackwell's block-scaled GEMMs: mxfp8_quant and
nvfp4_quant, one kernel body for both (the format is a compile-time field of the problem).

    x: (tokens, hidden) bf16/fp16 -> q: the elements, scales: one per block of a row

mxfp8 (OCP Microscaling v1.0, MXFP8 with E4M3 elements): blocks of 32; the block's shared
    exponent is e = floor(log2(amax)) - 8 (8: the largest exponent of e4m3), clamped to
    [-127, 127], stored as E8M0 (the byte e + 127, torch.float8_e8m0fnu); q = e4m3(x * 2^-e)
    rounded to nearest even and saturated to +-448 (the OCP rule: the block's largest element
    lands in [256, 512)). torchao's MX "floor" scale mode computes the same; TransformerEngine
    and flashinfer round the scale up instead (2^ceil(log2(amax / 448))), one exponent apart
    where the largest element would saturate. q: (tokens, hidden) torch.float8_e4m3fn.
nvfp4 (NVIDIA's NVFP4, as ModelOpt and flashinfer's fp4_quantize define it): blocks of 16 with
    an e4m3 scale and one per-tensor fp32 `global_scale` (448 * 6 / amax of the tensor):
        s  = e4m3((amax / 6) * global_scale)            rounded to nearest even, saturating
        q  = e2m1(x * (global_scale / s))                (0 where s is 0 or NaN)
    every step an IEEE fp32 operation (flashinfer uses approximate reciprocals for the two
    divisions, so it can differ from this in the last bit of a step). e2m1 holds 0, 0.5, 1,
    1.5, 2, 3, 4, 6: rounded to nearest even, saturating to +-6; two per byte, the even element
    in the low nibble (torch.float4_e2m1fn_x2's packing, and PTX's cvt e2m1x2). q: (tokens,
    hidden / 2) torch.float4_e2m1fn_x2, scales torch.float8_e4m3fn.

Special values, the same in both formats: amax is the largest |x| by bit pattern, so a NaN
anywhere in a block makes it NaN; such a block gets the NaN scale (E8M0 0xFF, e4m3 0x7F) and all
its elements +0, so it dequantises to NaN as its input was, whatever the conversion makes of a
NaN. A block with an infinity and no NaN has a finite scale (E8M0: exponent 120; NVFP4: s
saturates to 448) and its infinities saturate (+-448, +-6). Values in the denormal range of the
input are scaled exactly (no flush to zero); an all-zero block gets the smallest scale (E8M0
2^-127, e4m3 0) and zeros, -0 kept as -0.

Scales: row_major (tokens, hidden / block) or swizzled, the 128 x 4 tiles Blackwell's GEMMs read
(scale_layout.py), padding zeroed by the same launch.

Hardware: on sm_100a e2m1 comes from cvt.rn.satfinite.e2m1x2.f32; sm_90a has no e2m1
conversion, so the kernel rounds each element with one fma, its step and offset taken from the
exponent (bit-exact: tests/gpu checks it on the GPU, and every fp32 pattern was checked on the
CPU). e4m3 is cvt.rn.satfinite.e4m3x2.f32 on both. 256-bit global loads exist on sm_100 only.

Work split: activation's. A row is hidden / VEC vectors, numbered row-major over the rows; a
block takes THREADS * VECTORS_PER_THREAD consecutive numbers, thread `tid` the numbers tid,
tid + THREADS, ... A quantisation block is block / VEC consecutive vectors, so its lanes are
adjacent and aligned in the warp: they combine their amax by butterfly shuffles, and the first
writes the scale. The padding of the swizzled scales is zeroed by extra thread blocks, one
32-bit word (a padded row's 4 scales of one tile) per thread and vector.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from cutetune.kernels import scale_layout
from cutetune.kernels.block_limits import (
    WARP,
    block_fits_register_file,
    block_size_within_device,
    estimated_registers,
)
from cutetune.kernels.cost import Cost
from cutetune.kernels.dtypes import DTYPE_BYTES, TORCH_DTYPES
from cutetune.kernels.registry import (
    DeviceCompile,
    KernelDef,
    NotApplicableError,
    Tensors,
    VerificationError,
    register,
)
from cutetune.spaces.models import ModelShape
from cutetune.spaces.problem import Problem
from cutetune.spaces.space import Constraint, Param, Space

MXFP8, NVFP4 = "mxfp8", "nvfp4"
BLOCK = {MXFP8: 32, NVFP4: 16}
# Input dtypes: activations in half precision.
INPUT_DTYPES = ("bfloat16", "float16")
E4M3_MAX = 448.0
E2M1_MAX = 6.0
# Log2 of the largest power of two e4m3 holds (448 = 1.75 * 2^8): OCP's emax of the element.
E4M3_EMAX = 8
E8M0_BIAS = 127
E8M0_NAN = 0xFF
E4M3_NAN = 0x7F
# The torch dtypes of each format's elements and scales.
VALUE_DTYPES = {MXFP8: torch.float8_e4m3fn, NVFP4: torch.float4_e2m1fn_x2}
SCALE_DTYPES = {MXFP8: torch.float8_e8m0fnu, NVFP4: torch.float8_e4m3fn}
# Elements per byte of q.
PACKING = {MXFP8: 1, NVFP4: 2}
# e2m1's magnitudes by code (the code's 3 low bits; bit 3 is the sign).
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# The compute capability that first has 256-bit global loads (ld.global.v8.b32).
WIDE_ACCESS_CC = 10
MIN_BITS_PER_THREAD = 128
# FP32 operations per element: the absolute value and max, the scaling multiply, the
# conversion (counted as one, though sm_90a rounds e2m1 in software: docs/performance-notes.md).
FLOPS_PER_ELEMENT = 3


@dataclass(frozen=True, kw_only=True)
class BlockQuantProblem(Problem):
    """What both formats fix: the input dtype, the row width and the scales' layout."""

    dtype: str
    hidden: int
    scale_layout: str

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dtype not in INPUT_DTYPES:
            raise ValueError(f"dtype {self.dtype!r} not supported: use "
                             f"{', '.join(INPUT_DTYPES)}")
        if (not isinstance(self.hidden, int) or isinstance(self.hidden, bool)
                or self.hidden < 1 or self.hidden % self.block):
            raise ValueError(f"hidden must be a positive multiple of {self.format}'s block of "
                             f"{self.block}, got {self.hidden!r}")
        if self.scale_layout not in scale_layout.SCALE_LAYOUTS:
            raise ValueError(f"scale_layout must be one of {scale_layout.SCALE_LAYOUTS}, got "
                             f"{self.scale_layout!r}")

    @property
    def format(self) -> str:
        raise NotImplementedError

    @property
    def block(self) -> int:
        return BLOCK[self.format]

    @property
    def scale_columns(self) -> int:
        return self.hidden // self.block

    @property
    def swizzled(self) -> bool:
        return self.scale_layout == scale_layout.SWIZZLED


@dataclass(frozen=True, kw_only=True)
class MXFP8QuantProblem(BlockQuantProblem):
    @property
    def format(self) -> str:
        return MXFP8


@dataclass(frozen=True, kw_only=True)
class NVFP4QuantProblem(BlockQuantProblem):
    @property
    def format(self) -> str:
        return NVFP4


@dataclass(frozen=True)
class BlockQuantConfig:
    vector_bits: int
    vectors_per_thread: int
    warps_per_block: int


def vector_elements(problem: BlockQuantProblem, config: BlockQuantConfig) -> int:
    return config.vector_bits // (8 * DTYPE_BYTES[problem.dtype])


def lanes_per_block(problem: BlockQuantProblem, config: BlockQuantConfig) -> int:
    """Threads (adjacent lanes) that share one quantisation block."""
    return problem.block // vector_elements(problem, config)


def _registers_per_thread(problem: BlockQuantProblem, config: BlockQuantConfig) -> int:
    # Each vector in fp32 (its bits kept beside for the amax), loaded before the first store.
    return estimated_registers(2 * config.vectors_per_thread * vector_elements(problem, config))


SPACE = Space(
    config_type=BlockQuantConfig,
    params=(
        Param("vector_bits", (64, 128, 256), "bits of x per thread per global load"),
        Param("vectors_per_thread", (1, 2, 4),
              "vectors a thread loads before its first store (ILP)"),
        Param("warps_per_block", (1, 4, 8), "warps in one thread block"),
    ),
    constraints=(
        Constraint(
            "wide_access_needs_sm_100",
            "256-bit global loads (ld.global.v8.b32) exist on compute capability 10.0 and "
            "later only",
            lambda p, c, d: (c.vector_bits < 256
                             or int(d.compute_capability.split(".")[0]) >= WIDE_ACCESS_CC),
        ),
        block_fits_register_file(_registers_per_thread),
        block_size_within_device(),
    ),
)


def default_config(problem: BlockQuantProblem, device) -> BlockQuantConfig:
    """The seed heuristic, activation's: 128-bit loads, one per thread; the largest block of
    8 or 4 warps that still gives every SM a block, else one warp per block (decode)."""
    vectors = problem.num_tokens * problem.hidden // vector_elements(
        problem, BlockQuantConfig(MIN_BITS_PER_THREAD, 1, 1))
    warps = next((w for w in (8, 4) if vectors >= w * WARP * device.sm_count), 1)
    return BlockQuantConfig(MIN_BITS_PER_THREAD, 1, warps)


def scales_shape(problem: BlockQuantProblem) -> tuple[int, int]:
    return scale_layout.scales_shape(problem.scale_layout, problem.num_tokens,
                                     problem.scale_columns)


def padding_words(problem: BlockQuantProblem) -> int:
    """32-bit words of the swizzled scales' padded rows (0 for row-major scales)."""
    if not problem.swizzled:
        return 0
    rows, columns = scales_shape(problem)
    return (rows - problem.num_tokens) * columns // scale_layout.TILE_COLUMNS


def _threads_per_block(config: BlockQuantConfig) -> int:
    return config.warps_per_block * WARP


def blocks(problem: BlockQuantProblem, config: BlockQuantConfig) -> int:
    """The launch's thread blocks: those of the rows, then those zeroing the padding."""
    per_block = _threads_per_block(config) * config.vectors_per_thread
    vectors = problem.num_tokens * problem.hidden // vector_elements(problem, config)
    return math.ceil(vectors / per_block) + math.ceil(padding_words(problem) / per_block)


def cost(problem: BlockQuantProblem, config: BlockQuantConfig, device) -> Cost:
    elements = problem.num_tokens * problem.hidden
    rows, columns = scales_shape(problem)
    return Cost(
        # x read once; q and every scale byte (the padding too) written once; the global scale.
        bytes_moved=(elements * DTYPE_BYTES[problem.dtype] + elements // PACKING[problem.format]
                     + rows * columns + (4 if problem.format == NVFP4 else 0)),
        flops=FLOPS_PER_ELEMENT * elements,
        blocks=blocks(problem, config),
        threads_per_block=_threads_per_block(config),
        registers_per_thread=_registers_per_thread(problem, config),
        bytes_in_flight_per_thread=config.vectors_per_thread * config.vector_bits // 8,
    )


# ---------------------------------------------------------------------------------------------
# The launch (the kernel, its launcher and its compile are device/block_quant.py)


def launch_mxfp8(compiled, tensors: Tensors) -> None:
    compiled(tensors["x"], tensors["q"], tensors["scales"])


def launch_nvfp4(compiled, tensors: Tensors) -> None:
    compiled(tensors["x"], tensors["global_scale"], tensors["q"], tensors["scales"])


# ---------------------------------------------------------------------------------------------
# Reference


def _e2m1_codes(y: torch.Tensor) -> torch.Tensor:
    """The e2m1 codes (uint8, sign in bit 3) of fp32 y (no NaN): the nearest of E2M1_VALUES to
    |y| clamped to 6, ties to the even code. Counted from comparisons with Python scalars, no
    table: the reference runs inside a CUDA graph capture (the bench times it there), which
    cannot copy a table built on the host to the device."""
    magnitude = y.abs()
    codes = torch.zeros_like(y, dtype=torch.uint8)
    # Past the midpoint of codes k and k + 1, |y| rounds up to k + 1; at it, to the even one.
    for k, (low, high) in enumerate(itertools.pairwise(E2M1_VALUES)):
        midpoint = (low + high) / 2
        codes += (magnitude >= midpoint) if k % 2 else (magnitude > midpoint)
    return codes + 8 * torch.signbit(y).to(torch.uint8)


def _mxfp8(x: torch.Tensor, amax: torch.Tensor, nan: torch.Tensor):
    """q (float8_e4m3fn) and the E8M0 scale bytes of blocks x (..., 32) of maxima amax."""
    # floor(log2(amax)) from frexp (amax = m * 2^E, m in [0.5, 1)); zero and infinity apart.
    exponent = torch.frexp(amax).exponent - 1
    exponent = torch.where(amax == 0, -E8M0_BIAS - E4M3_EMAX, exponent)
    exponent = torch.where(amax.isinf() | nan, E8M0_BIAS + 1, exponent)
    shared = (exponent - E4M3_EMAX).clamp(-E8M0_BIAS, E8M0_BIAS)
    # 2^-shared built from its bits (a normal float: shared lies in [-127, 120]), exact on any
    # device, where pow or exp2 might not be.
    multiplier = ((E8M0_BIAS - shared).to(torch.int32) << 23).view(torch.float32)
    y = torch.where(nan.unsqueeze(-1), 0.0, x * multiplier.unsqueeze(-1))
    q = y.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    scales = torch.where(nan, E8M0_NAN, shared + E8M0_BIAS).to(torch.uint8)
    return q.flatten(-2), scales


def _divided(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a / b rounded to nearest (IEEE), in eager and compiled torch alike: torch.compile lowers
    addcdiv's division to Triton's div_rn on CUDA, and a plain / to its approximate div.full.
    0 + a / b is a / b (a and b are non-negative here)."""
    return torch.addcdiv(torch.zeros_like(a), a, b)


def _nvfp4(x: torch.Tensor, amax: torch.Tensor, nan: torch.Tensor, global_scale: torch.Tensor):
    """q (e2m1 pairs as uint8) and the e4m3 scale bytes of blocks x (..., 16)."""
    s = (_divided(amax, torch.full_like(amax, E2M1_MAX)) * global_scale).clamp(
        max=E4M3_MAX).to(torch.float8_e4m3fn)
    s_value = s.float()
    out_scale = torch.where(~(s_value > 0), 0.0,  # zero, or NaN (a NaN block)
                            _divided(global_scale.expand_as(s_value), s_value))
    y = torch.where(nan.unsqueeze(-1), 0.0, x * out_scale.unsqueeze(-1)).flatten(-2)
    codes = _e2m1_codes(y)
    return codes[..., 0::2] | (codes[..., 1::2] << 4), s.view(torch.uint8)


def quantised(x: torch.Tensor, problem: BlockQuantProblem,
              global_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """q and the scales, in their torch dtypes and the problem's layout, of x (tokens, hidden),
    computed as the module docstring states (bit-exact: the kernel's outputs equal these)."""
    blocked = x.float().unflatten(-1, (problem.scale_columns, problem.block))
    amax = blocked.abs().amax(dim=-1)  # NaN wherever the block holds one
    nan = amax.isnan()
    if problem.format == MXFP8:
        q, scale_bytes = _mxfp8(blocked, amax, nan)
    else:
        q, scale_bytes = _nvfp4(blocked, amax, nan, global_scale.float())
    if problem.swizzled:
        scale_bytes = scale_layout.swizzle(scale_bytes)
    return _as_format(q, scale_bytes, problem.format)


@torch.compiler.disable
def _as_format(q: torch.Tensor, scale_bytes: torch.Tensor,
               fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The bytes viewed as the format's dtypes, outside any compiled graph: inductor's CPU
    code generator has no float8_e8m0fnu (torch.compile of the reference runs in the bench)."""
    return q.view(VALUE_DTYPES[fmt]), scale_bytes.view(SCALE_DTYPES[fmt])


def reference(tensors: Tensors, problem: BlockQuantProblem) -> dict[str, torch.Tensor]:
    q, scales = quantised(tensors["x"], problem, tensors.get("global_scale"))
    return {"q": q, "scales": scales}


def check(outputs: Tensors, expected: dict[str, torch.Tensor],
          problem: BlockQuantProblem) -> None:
    """q and the scales bit for bit (the padding of swizzled scales too)."""
    for name in ("q", "scales"):
        actual, wanted = outputs[name], expected[name]
        if actual.dtype != wanted.dtype or actual.shape != wanted.shape:
            raise VerificationError(f"{name}: {actual.dtype} {tuple(actual.shape)}, expected "
                                    f"{wanted.dtype} {tuple(wanted.shape)}")
        differ = actual.view(torch.uint8) != wanted.view(torch.uint8)
        count = int(differ.sum())
        if count:
            first = tuple(int(i) for i in differ.nonzero()[0])
            raise VerificationError(
                f"{name}: {count} of {differ.numel()} bytes differ; first at {first}: got "
                f"{int(actual.view(torch.uint8)[first]):#04x}, expected "
                f"{int(wanted.view(torch.uint8)[first]):#04x}")


# ---------------------------------------------------------------------------------------------
# Inputs and model problems


# Each block's magnitude, as a power of two drawn from this range: MXFP8's scales span every
# binade of the input; NVFP4's e4m3 block scales span about 18 binades under one global scale,
# so its blocks stay within them, a few above NVFP4_CALIBRATED_AMAX (their scales saturate).
MAGNITUDES = {MXFP8: (-30, 12), NVFP4: (-8, 6)}
# The tensor amax NVFP4's global scale is calibrated for, as a model's checkpoint states it.
NVFP4_CALIBRATED_AMAX = 2.0 ** 5


def bench_inputs(problem: BlockQuantProblem, device, generator: torch.Generator) -> Tensors:
    """make_inputs without its denormal blocks: torch.compile's Triton code may flush denormals
    to zero, and the bench compares every candidate with the reference bit for bit before it
    times it (the verifier and the GPU tests keep them)."""
    return make_inputs(problem, device, generator, denormals=False)


def make_inputs(problem: BlockQuantProblem, device, generator: torch.Generator,
                denormals: bool = True) -> Tensors:
    """x with each block of its own magnitude (MAGNITUDES) and about one block in eight a
    special case: all zeros (+0 or -0), the input dtype's denormals, e2m1's rounding ties and
    e4m3's saturation points, and values at the top of the input dtype's range; for NVFP4 the
    global scale 448 * 6 / NVFP4_CALIBRATED_AMAX. q and the scales allocated (the verifier
    poisons them). Without `denormals`, the denormal blocks are plain ones (bench_inputs)."""
    dtype = TORCH_DTYPES[problem.dtype]
    shape = (problem.num_tokens, problem.scale_columns, problem.block)
    low, high = MAGNITUDES[problem.format]
    magnitude = torch.randint(low, high + 1, shape[:2], generator=generator, device=device)
    x = torch.randn(shape, generator=generator, device=device) * torch.exp2(
        magnitude.float()).unsqueeze(-1)
    x = _with_special_blocks(x, problem, dtype, generator, denormals).to(dtype)
    tensors = {"x": x.reshape(problem.num_tokens, problem.hidden),
               "q": torch.empty(problem.num_tokens, problem.hidden // PACKING[problem.format],
                                dtype=VALUE_DTYPES[problem.format], device=device),
               "scales": torch.empty(scales_shape(problem), dtype=SCALE_DTYPES[problem.format],
                                     device=device)}
    if problem.format == NVFP4:
        tensors["global_scale"] = torch.full((1,), E4M3_MAX * E2M1_MAX / NVFP4_CALIBRATED_AMAX,
                                             device=device)
    return tensors


def _with_special_blocks(x: torch.Tensor, problem: BlockQuantProblem, dtype: torch.dtype,
                         generator: torch.Generator, denormals: bool) -> torch.Tensor:
    """x (tokens, blocks, block) with about one block in eight replaced by a special case."""
    tiny = torch.finfo(dtype).tiny  # the smallest normal: denormals lie below it
    edges = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0, 448.0, 464.0, 480.0,
                          -0.25, -2.5, -5.0, -0.0], device=x.device)
    cases = {"zeros": torch.zeros(problem.block, device=x.device),
             "negative zeros": torch.full((problem.block,), -0.0, device=x.device),
             "denormals": tiny * torch.linspace(-0.9, 0.9, problem.block, device=x.device),
             "edges": edges.repeat(problem.block // edges.numel()),
             "dtype's range": torch.finfo(dtype).max * torch.linspace(-1, 1, problem.block,
                                                                      device=x.device)}
    kind = torch.randint(0, 8 * len(cases), x.shape[:2], generator=generator, device=x.device)
    for index, (name, case) in enumerate(cases.items()):
        if name != "denormals" or denormals:
            x = torch.where((kind == index).unsqueeze(-1), case, x)
    return x


def problems_for_model(kind: type[BlockQuantProblem], fmt: str):
    """The problems of a model whose activation_quant is `fmt` (the format of `kind`): the
    inputs of its linear layers (the hidden size, the attention output where it differs, each
    MLP's intermediate width), with swizzled scales, the layout the GEMMs read."""

    def problems(model: ModelShape, dtype: str) -> list[BlockQuantProblem]:
        quant = model.activation_quant
        if quant is None or quant.format != fmt:
            raise NotApplicableError(
                f"model {model.name} does not quantise its activations to {fmt} (its "
                f"quantization_config reads as {quant.format if quant else 'none'})")
        attention = (model.num_q_heads * model.head_dim
                     if model.num_q_heads and model.head_dim else None)
        named = {"hidden size": model.hidden_size, "attention width": attention,
                 "intermediate size": model.intermediate_size,
                 "expert intermediate size": model.expert_intermediate,
                 "shared expert intermediate size": model.shared_expert_intermediate}
        # A width the block does not divide has no such quantisation in any GEMM: the whole
        # kernel is refused with the widths named, rather than those widths left out unsaid.
        unfit = [f"{name} {w}" for name, w in named.items() if w and w % BLOCK[fmt]]
        if unfit:
            raise NotApplicableError(
                f"model {model.name} quantises its activations to {fmt} in blocks of "
                f"{BLOCK[fmt]}, which do not divide its {', '.join(unfit)}")
        return [kind(num_tokens=1, dtype=dtype, hidden=w, scale_layout=scale_layout.SWIZZLED)
                for w in dict.fromkeys(w for w in named.values() if w)]

    return problems


def _kernel_def(name: str, description: str, problem_type: type[BlockQuantProblem], fmt: str,
                launch) -> KernelDef:
    """The two kernels differ in their format (a compile-time field of the problem), their
    launch (NVFP4 takes the global scale) and their model problems."""
    return KernelDef(
        name=name,
        description=description,
        problem_type=problem_type,
        space=SPACE,
        problems_for_model=problems_for_model(problem_type, fmt),
        default_config=default_config,
        cost=cost,
        compile_function=DeviceCompile("cutetune.kernels.device.block_quant"),
        launch=launch,
        make_inputs=make_inputs,
        reference=reference,
        outputs=("q", "scales"),
        written_in_place=(),
        tolerance={},
        check=check,
        source_file=__file__,
        bench_inputs=bench_inputs,
    )


MXFP8_KERNEL = register(_kernel_def(
    "mxfp8_quant", "MXFP8 quantisation: e4m3 values and an E8M0 scale per block of 32 "
    "(swizzled for Blackwell's GEMMs or row-major)", MXFP8QuantProblem, MXFP8, launch_mxfp8))
NVFP4_KERNEL = register(_kernel_def(
    "nvfp4_quant", "NVFP4 quantisation: e2m1 values packed in pairs and an e4m3 scale per "
    "block of 16 under a per-tensor global scale", NVFP4QuantProblem, NVFP4, launch_nvfp4))
