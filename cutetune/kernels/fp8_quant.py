"""What the FP8 per-token-group quantisation kernels share: the format, the scales' layouts, the
fp32 torch reference, the exact check, the inputs' edge cases and the model's groups.

    amax[t, g]  = max |v[t, g*G : (g+1)*G]|              NaN elements left out
    scale[t, g] = max(amax, AMAX_FLOOR) / 448             fp32 division, round to nearest
                  (ue8m0: rounded up to a power of two, 2^ceil(log2 scale), exactly)
    q[t, i]     = e4m3(v[t, i] * (1 / scale[t, i // G]))  fp32 reciprocal and product, each
                                                          rounded to nearest, then to e4m3:
                                                          nearest even, saturating to +-448

v is what the kernel quantises: x itself (fp8_group_quant), silu(gate) * up or the RMSNorm of
the residual sum, each rounded to the input dtype first, as the unfused chain (the activation or
the norm written in that dtype, then fp8_group_quant) holds it, so that a fused kernel and the
chain write the same bytes.

AMAX_FLOOR is 1e-10, as vLLM's and SGLang's per_token_group_quant_fp8 take `eps` (and DeepGEMM's
reference): an all-zero group gets scale 1e-10 / 448 and zeros, never a division by zero. Those
kernels divide each value by the scale; the product by the reciprocal is within an fp32 ulp of
that quotient, so a code differs from theirs only where the quotient sits at an e4m3 rounding
tie, and the kernels take one division a group instead of one an element (under UE8M0 the
reciprocal is exact and the product is the quotient).
UE8M0 rounds the scale up (never down, so no |v| / scale passes 448 and saturates): exactly, from
its bits, where exp2(ceil(log2(s))) in fp32 (vLLM's Triton kernel) rounds a scale a few ulps
above a power of two down onto it.

The conversion is PTX's cvt.rn.satfinite.e4m3x2.f32 (sm_89 and later): round to nearest even, finite
values beyond 448 saturate to +-448, NaN stays NaN. Non-finite inputs, as the kernels and the
reference treat them: a NaN element is left out of its group's amax and quantises to NaN; an
infinite element makes its group's amax and scale infinite and the reciprocal zero, so the group's
finite elements quantise to zero and the infinite ones to NaN (inf * 0). torch's float8_e4m3fn cast
does not saturate (448 * 1.125 becomes NaN), so the reference clamps to +-448 first (clamp keeps
NaN).

Scales are fp32, (tokens, groups): row-major, or column-major (element [t, g] at t + g * stride,
stride >= tokens) as block-scaled GEMMs (DeepGEMM, CUTLASS's blockwise FP8 GEMM on sm_90a) read
them; the ops allocate column-major scales with the token stride padded to a multiple of 4
(16 bytes), the TMA-aligned layout DeepGEMM asks for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from cutetune.kernels.registry import NotApplicableError, Tensors, VerificationError
from cutetune.spaces.models import ModelShape
from cutetune.spaces.problem import Problem

FP8_DTYPE = torch.float8_e4m3fn
E4M3_MAX = 448.0
AMAX_FLOOR = 1e-10
REFERENCE_ROWS = 16384
GROUP_SIZES = (64, 128)
QUANT_DTYPES = ("bfloat16", "float16")
# An fp32's exponent bits, and the mantissa bits below them.
EXPONENT_MASK, MANTISSA_MASK = 0x7F800000, 0x007FFFFF
# Column-major scales' token stride is padded to this many (16 bytes of fp32): TMA's alignment.
SCALE_TOKEN_ALIGN = 4
# The fp32 operations per element: |v|, the max, the product by the reciprocal and the
# conversion (the group's one division is shared by its elements).
QUANT_FLOPS_PER_ELEMENT = 4


@dataclass(frozen=True, kw_only=True)
class GroupQuantFields(Problem):
    """The quantisation's static fields, which every FP8 group-quant problem has: the group
    size, the scales' layout and whether they are powers of two."""

    group_size: int
    column_major_scales: bool
    ue8m0: bool

    def check_quant(self, dtype: str, width: int, width_name: str) -> None:
        if dtype not in QUANT_DTYPES:
            raise ValueError(f"dtype {dtype!r} not supported: use {', '.join(QUANT_DTYPES)}")
        if self.group_size not in GROUP_SIZES:
            raise ValueError(f"group_size must be one of {GROUP_SIZES}, got "
                             f"{self.group_size!r}")
        if (not isinstance(width, int) or isinstance(width, bool) or width < 1
                or width % self.group_size):
            raise ValueError(f"{width_name} must be a positive multiple of group_size "
                             f"{self.group_size}, got {width!r}")
        for name in ("column_major_scales", "ue8m0"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")


def round_up_to_power_of_two(scale: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2 s) of positive fp32 scales, exactly, from their bits as the kernels take
    it: adding the mantissa's all-ones carries into the exponent unless the mantissa is zero,
    and masking keeps the exponent alone; infinity stays infinite. Integer operations, which
    torch.compile keeps exact."""
    bits = scale.contiguous().view(torch.int32)
    return ((bits + MANTISSA_MASK) & EXPONENT_MASK).view(torch.float32)


def quantize_reference(values: torch.Tensor, group_size: int, ue8m0: bool
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """The fp32 reference of the quantisation of `values` (tokens, width), fp32: (q as fp32
    values of float8_e4m3fn codes, (tokens, width)), (scales, (tokens, width / group_size)).

    The scale and its reciprocal are taken in fp64 and rounded to fp32, which gives the
    correctly rounded fp32 results (double rounding is innocuous for a division at 53 >= 2 x 24
    + 2 bits): the same bits as the kernels' fp32 division and rcp.rn, and under torch.compile
    too, whose Triton code divides fp32 by the approximate div.full.f32. The products are fp32
    (mul.rn, as the kernels'): an fp64 product of the fp32 reciprocal is as exact, but under
    torch.compile it disagreed with eager in a few elements a row on an H100, as if the
    compiled code had skipped the reciprocal's rounding to fp32."""
    tokens, width = values.shape
    groups = values.reshape(tokens, width // group_size, group_size)
    amax = torch.where(groups.isnan(), 0.0, groups.abs()).amax(dim=-1)
    scales = (torch.clamp(amax, min=AMAX_FLOOR).double() / E4M3_MAX).float()
    if ue8m0:
        scales = round_up_to_power_of_two(scales)
    inverses = (1.0 / scales.double()).float()
    q = torch.empty(tokens, width, dtype=torch.float32, device=values.device)
    # A slice of rows at a time: the products of a whole MoE dispatch buffer at 32768 tokens
    # (266k rows of 7168) and what the clamp and the casts make of them take gigabytes.
    for start in range(0, tokens, REFERENCE_ROWS):
        rows = slice(start, start + REFERENCE_ROWS)
        products = groups[rows] * inverses[rows].unsqueeze(-1)
        q[rows] = torch.clamp(products, -E4M3_MAX, E4M3_MAX).to(FP8_DTYPE).float().reshape(
            -1, width)
    return q, scales


@torch.compiler.disable
def rounded_to(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 `values` rounded to `dtype` (bf16, fp16) and back: what a fused kernel quantises,
    as the unfused chain writes it. Left out of torch.compile's graphs: Inductor computes a
    bf16 intermediate in fp32 and would quantise the unrounded values."""
    return values.to(dtype).float()


def empty_scales(tokens: int, groups: int, column_major: bool,
                 device: torch.device | str) -> torch.Tensor:
    """A (tokens, groups) fp32 scales tensor in the layout the ops allocate: row-major, or
    column-major with the token stride padded to SCALE_TOKEN_ALIGN."""
    if not column_major:
        return torch.empty(tokens, groups, dtype=torch.float32, device=device)
    stride = -(-max(tokens, 1) // SCALE_TOKEN_ALIGN) * SCALE_TOKEN_ALIGN
    return torch.empty_strided((tokens, groups), (1, stride), dtype=torch.float32,
                               device=device)


def check_exact(outputs: Tensors, expected: Mapping[str, torch.Tensor],
                names: tuple[str, ...]) -> None:
    """Raise VerificationError unless each output equals its expected values exactly (q as
    e4m3 values, scales as fp32, the sign of a zero too), NaN where and only where NaN is
    expected. Any NaN equals any NaN, whatever its sign: a NaN's sign means nothing, and the
    kernel and the reference need not agree on it (torch's e4m3 cast keeps the sign of the
    NaN it is given, and the sign of inf / inf, an infinite group's infinite element, is the
    machine's choice: negative on x86)."""
    for name in names:
        actual = outputs[name].float()
        wanted = expected[name].float()
        if tuple(actual.shape) != tuple(wanted.shape):
            raise VerificationError(f"{name}: shape {tuple(actual.shape)}, expected "
                                    f"{tuple(wanted.shape)}")
        both_nan = actual.isnan() & wanted.isnan()
        # -0.0 == 0.0: the sign of a zero is its own check.
        same = both_nan | ((actual == wanted) & (torch.signbit(actual) == torch.signbit(wanted)))
        bad = ~same
        count = int(bad.sum())
        if count:
            first = tuple(int(i) for i in bad.nonzero()[0])
            raise VerificationError(
                f"{name}: {count} of {actual.numel()} elements differ from the reference "
                f"(exact); first at {first}: got {actual[first].item():.9g}, expected "
                f"{wanted[first].item():.9g}")


# x's dtype's largest relative rounding step: one ulp of its significand's smallest value
# (bf16's 8 bits, fp16's 11).
DTYPE_STEP = {"bfloat16": 2.0**-7, "float16": 2.0**-10}
# How many of a fused kernel's q codes (or scales) may differ from the reference's by a step:
# this share of them, or this many where that is more (a rounding flips about one value in a
# thousand).
FUSED_INEXACT_SHARE = 0.01
FUSED_INEXACT_ALWAYS = 4


def e4m3_step(q: torch.Tensor) -> torch.Tensor:
    """The distance from each e4m3 value (as fp32) to its neighbour away from zero: 2^(e - 3)
    for normals (|q| >= 2^-6), 2^-9 for subnormals and zero."""
    _, exponent = torch.frexp(q.abs().clamp(min=2.0**-6))
    return torch.ldexp(torch.ones_like(q), exponent - 4)


def check_fused(outputs: Tensors, expected: Mapping[str, torch.Tensor], dtype: str) -> None:
    """The check of a fused kernel, whose activation or norm is computed in fp32 by other
    instructions than torch's (approximate exp2 and reciprocal, a reduction in another order),
    so that a value may round to x's dtype one step apart from the reference's, moving its e4m3
    code by at most one step and its group's scale by one step of x's dtype. VerificationError
    unless NaN lies where the reference has it, every scale lies within one step of x's dtype
    and every q code within one e4m3 step of the reference's, and all but FUSED_INEXACT_SHARE
    of each (or FUSED_INEXACT_ALWAYS) are exact (an error in the rounding itself moves far
    more)."""
    for name in ("q", "scales"):
        actual, wanted = outputs[name].float(), expected[name].float()
        if tuple(actual.shape) != tuple(wanted.shape):
            raise VerificationError(f"{name}: shape {tuple(actual.shape)}, expected "
                                    f"{tuple(wanted.shape)}")
        nan = wanted.isnan()
        if not torch.equal(actual.isnan(), nan):
            raise VerificationError(f"{name}: NaN at {int((actual.isnan() != nan).sum())} "
                                    "elements where the reference has none, or none where it has")
        actual, wanted = actual[~nan], wanted[~nan]
        step = (DTYPE_STEP[dtype] * wanted.abs() if name == "scales" else e4m3_step(wanted))
        far = (actual - wanted).abs() > step
        if far.any():
            first = int(far.nonzero()[0])
            raise VerificationError(f"{name}: {int(far.sum())} of {actual.numel()} elements "
                                    f"off by more than one rounding step; first got "
                                    f"{actual[first].item():.9g}, expected "
                                    f"{wanted[first].item():.9g}")
        inexact = int((actual != wanted).sum())
        allowed = max(FUSED_INEXACT_ALWAYS, int(FUSED_INEXACT_SHARE * actual.numel()))
        if inexact > allowed:
            raise VerificationError(f"{name}: {inexact} of {actual.numel()} elements differ from "
                                    f"the reference by a rounding step; at most {allowed} may")


def with_edge_groups(values: torch.Tensor, group_size: int,
                     generator: torch.Generator) -> torch.Tensor:
    """`values` (tokens, width; fp32, about N(0, 1)) with some groups made edge cases, so every
    verification meets them (which groups, from the generator; as many as there are groups):
    all zeros; values below the amax floor (scale 1e-10 / 448), among them bf16 subnormals;
    fp16 subnormals; the saturation edge and e4m3's rounding ties (448 and -448 set the scale
    to 1; 1.0625 lies halfway between 1.0 and 1.125, 0.78125 between 0.75 and 0.8125, 1.5 * 2^-9
    between e4m3's subnormals 2^-9 and 2^-8, 2^-10 between 0 and 2^-9: each rounds to even);
    negative zeros. Never NaN or infinity: the kernels' treatment of those has tests of its
    own."""
    tokens, width = values.shape
    groups = values.reshape(tokens * (width // group_size), group_size)
    picks = torch.randperm(groups.shape[0], generator=generator, device=values.device)
    ties = [448.0, -448.0, 1.0625, -0.78125, 1.5 * 2.0**-9, -(2.0**-10), 0.5, -2.0**-12]
    edge = [
        torch.zeros(group_size),
        torch.linspace(-1e-12, 1e-12, group_size).index_fill(0, torch.tensor([1]), 1e-39),
        torch.linspace(-6e-5, 6e-5, group_size),
        torch.tensor(ties * (group_size // len(ties))),
        torch.full((group_size,), -0.0),
    ]
    for pick, group in zip(picks.tolist(), edge, strict=False):
        groups[pick] = group.to(device=values.device, dtype=values.dtype)
    return groups.reshape(tokens, width)


def quant_groups_of(model: ModelShape, kernel: str) -> tuple[int, bool]:
    """The group size and whether the scales are powers of two that `model` quantises its
    activations with: its FP8 per-token groups (DeepSeek-V3's 1 x 128); NotApplicableError
    for a model that quantises none, or otherwise."""
    quant = model.activation_quant
    if quant is None or quant.format != "fp8_group":
        what = "no activation quantisation" if quant is None else f"{quant.format} activations"
        raise NotApplicableError(f"model {model.name} has {what}; {kernel} writes FP8 with one "
                                 "scale per group of a token's row (quantization_config's fp8 "
                                 "weight_block_size, or compressed-tensors' group strategy)")
    if quant.group_size not in GROUP_SIZES:
        raise NotApplicableError(f"model {model.name} quantises its activations in groups of "
                                 f"{quant.group_size}; {kernel} takes groups of "
                                 f"{' or '.join(map(str, GROUP_SIZES))}")
    return quant.group_size, quant.scale_format == "ue8m0"


def scales_bytes(tokens: int, width: int, group_size: int) -> int:
    return 4 * tokens * math.ceil(width / group_size)
