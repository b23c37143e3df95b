"""The math of rotary position embedding, as transformers and vLLM compute it: each pair's
inverse frequency (theta's, scaled as Llama 3, YaRN or linear scaling scale it), the float64
cos and sin of positions in vLLM's cache layout (of a rope problem's rotation:
problem_cos_sin), YaRN's ramp and attention factor, which position stream each pair of
multimodal RoPE rotates by, and the float64 rotation of the NeoX and GPT-J pairs (rotated).
The rope kernel's problem, reference and inputs (rope.py), the kernels built on it and the
drop-in's cos/sin caches use them."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from cutetune.kernels.rope import RopeProblem

# How a head's rotated elements pair: NeoX rotates halves, GPT-J interleaved pairs.
NEOX = "neox"
GPTJ = "gptj"
STYLES = (NEOX, GPTJ)

# Multimodal RoPE, by how its sections lay the three position streams over the pairs.
MROPE_NONE = "none"
MROPE_SECTIONS = "sections"  # Qwen2-VL, Qwen2.5-VL: a run of pairs per stream
MROPE_INTERLEAVED = "interleaved"  # Qwen3-VL: temporal, height, width, temporal, ...
MROPES = (MROPE_NONE, MROPE_SECTIONS, MROPE_INTERLEAVED)
STREAMS = 3


def yarn_ramp(rotary_dim: int, theta: float, beta_fast: float, beta_slow: float,
              original_max_position: int, truncate: bool) -> tuple[float, float]:
    """The ends of YaRN's ramp of pair indices, transformers' find_correction_range: where a
    pair turns beta_fast and beta_slow times over the original context, rounded outwards where
    `truncate`, clamped to [0, rotary_dim - 1] (transformers' bound, though the pairs stop at
    rotary_dim / 2), and apart by 0.001 where they meet, as transformers keeps them."""

    def dimension(turns: float) -> float:
        return (rotary_dim * math.log(original_max_position / (turns * 2 * math.pi))
                / (2 * math.log(theta)))

    low, high = dimension(beta_fast), dimension(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    return float(low), float(high + 0.001 if low == high else high)


def yarn_attention_factor(factor: float, mscale: float | None = None,
                          mscale_all_dim: float | None = None) -> float:
    """transformers' default attention_factor of YaRN where the config states none: the
    paper's 0.1 mscale ln(factor) + 1 (1 for factor <= 1), with mscale 1, or its ratio at
    mscale and mscale_all_dim where both are given (DeepSeek)."""

    def get_mscale(m: float) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    if mscale and mscale_all_dim:
        return get_mscale(mscale) / get_mscale(mscale_all_dim)
    return get_mscale(1.0)


def mrope_stream(pair: int, sections: tuple[str, int, int, int]) -> int:
    """The position stream (0 temporal, 1 height, 2 width) pair `pair` rotates by, as
    transformers' Qwen2-VL (sections: split by mrope_section) and Qwen3-VL (interleaved:
    recomposition_frequencies) lay them out."""
    layout, t, h, w = sections
    if layout == MROPE_SECTIONS:
        return 0 if pair < t else 1 if pair < t + h else 2
    if pair % 3 == 1 and pair < 3 * h:
        return 1
    if pair % 3 == 2 and pair < 3 * w:
        return 2
    return 0


def inverse_frequencies(rotary_dim: int, theta: float,
                        llama3: tuple[float, float, float, int] | None = None,
                        yarn: tuple[float, float, float, float] | None = None,
                        linear: float | None = None,
                        device: torch.device | str = "cpu") -> torch.Tensor:
    """theta ** (-2 i / rotary_dim) for each pair i, in float64 on `device`, scaled as Llama 3
    scales them where `llama3` (RopeProblem.llama3) is given: transformers'
    _compute_llama3_parameters; as YaRN does where `yarn` (RopeProblem.yarn) is: its
    _compute_yarn_parameters; divided by `linear` (RopeProblem.linear, Gemma 3's
    full-attention layers' factor) where it is given: its
    _compute_linear_scaling_rope_parameters. Built on the device, never copied there, so
    that a CUDA graph can capture it (the bench times the reference in one)."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=device) / rotary_dim
    inverse = theta ** -exponents
    if linear is not None:
        return inverse / linear
    if yarn is not None:
        factor, low, high, _ = yarn
        # Interpolated (divided by the factor) by the pair's weight on the ramp, extrapolated
        # (kept) by the rest.
        ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float64, device=device) - low)
                / (high - low)).clamp(0, 1)
        return inverse / factor * ramp + inverse * (1 - ramp)
    if llama3 is None:
        return inverse
    factor, low, high, context = llama3
    wavelength = 2 * math.pi / inverse
    scaled = torch.where(wavelength > context / low, inverse / factor, inverse)
    smooth = (context / wavelength - low) / (high - low)
    medium = (wavelength >= context / high) & (wavelength <= context / low)
    return torch.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


def cos_sin_table(positions: torch.Tensor, rotary_dim: int, theta: float,
                  llama3: tuple[float, float, float, int] | None = None,
                  yarn: tuple[float, float, float, float] | None = None,
                  linear: float | None = None) -> torch.Tensor:
    """(len(positions), rotary_dim) float64: cos of each pair's angle, then sin, the layout of
    vLLM's cos_sin_cache, both times YaRN's attention factor under `yarn` (as vLLM's YaRN cache
    holds them). In float64: an fp32 angle at position 2^17 is off by up to 0.008 rad."""
    angles = positions.to(torch.float64)[:, None] * inverse_frequencies(
        rotary_dim, theta, llama3, yarn, linear, positions.device)[None, :]
    table = torch.cat((angles.cos(), angles.sin()), dim=-1)
    return table if yarn is None else table * yarn[3]


def rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str) -> torch.Tensor:
    """x (tokens, heads, head_dim) with its first 2 * cos.shape[-1] elements rotated by cos and
    sin (tokens, pairs), in float64."""
    pairs = cos.shape[-1]
    x = x.to(torch.float64)
    out = x.clone()
    cos, sin = cos[:, None, :], sin[:, None, :]
    if style == NEOX:
        x1, x2 = x[..., :pairs], x[..., pairs:2 * pairs]
        out[..., :pairs] = x1 * cos - x2 * sin
        out[..., pairs:2 * pairs] = x2 * cos + x1 * sin
    else:
        x1, x2 = x[..., 0:2 * pairs:2], x[..., 1:2 * pairs:2]
        out[..., 0:2 * pairs:2] = x1 * cos - x2 * sin
        out[..., 1:2 * pairs:2] = x2 * cos + x1 * sin
    return out


def problem_cos_sin(positions: torch.Tensor, problem: RopeProblem) -> torch.Tensor:
    """The (tokens, rotary_dim) float64 cos and sin of `positions` as `problem` rotates by them:
    cos_sin_table's, or under mrope each pair's column from the table of its stream's
    positions (positions is (3, tokens))."""
    if problem.mrope_sections is None:
        return cos_sin_table(positions, problem.rotary_dim, problem.theta, problem.llama3,
                             problem.yarn, problem.linear)
    tables = [cos_sin_table(stream, problem.rotary_dim, problem.theta) for stream in positions]
    pairs = problem.rotary_dim // 2
    streams = torch.tensor([mrope_stream(i, problem.mrope_sections) for i in range(pairs)],
                           device=positions.device).repeat(2)  # cos's columns, then sin's
    return torch.stack(tables).gather(0, streams.expand(1, positions.shape[1], -1))[0]
