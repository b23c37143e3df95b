"""qk_norm_rope with the paged KV cache write: per-head RMSNorm and RoPE of q and k in place, and
k (normed and rotated) and v written into vLLM's paged key and value caches, in one launch: the
whole path of an attention layer between its qkv projection and its attention.

    q, k <- qk_norm_rope(q, k)                              (cutetune.kernels.qk_norm_rope)
    key_cache[slot // block_size, slot % block_size] <- k[token] / k_scale   for every token
    value_cache[slot // block_size, slot % block_size] <- v[token] / v_scale  whose slot >= 0

slot = slot_mapping[token], as vLLM's reshape_and_cache_flash takes it: (tokens,) int64, -1 for
a token written nowhere (padding). key_cache and value_cache are (num_blocks, block_size,
kv_heads, head_dim), in q's dtype (the scales then unused) or FP8 e4m3, each value divided by
its per-tensor fp32 scale (k_scale, v_scale: one element each; the kernel multiplies by the
reciprocal, within an fp32 ulp of the quotient) and rounded to it, saturating.
k's cache value is k as the kernel stores it in q's dtype, so the cache holds what an unfused
reshape_and_cache_flash after qk_norm_rope would. v is copied, neither normalised nor rotated.

Work split and heuristic: qk_norm_rope's. The threads of a k head also store it in the cache
and copy v's head of the same token and index, loaded with the slot before the head's shuffles,
so the space is qk_norm_rope's with its register limits counting v's share too. The problem is
qk_norm_rope's with the cache's dtype and block size, so one compile serves every number of
blocks. This is a kernel of its own, not a form of qk_norm_rope, because its call takes five
more tensors: an op's fast path passes one fixed list of arguments to its kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from cutetune.kernels import qk_norm_rope
from cutetune.kernels.block_limits import MAX_ELEMENTS_PER_THREAD, block_fits_register_file
from cutetune.kernels.cost import Cost
from cutetune.kernels.dtypes import DTYPE_BYTES, TORCH_DTYPES
from cutetune.kernels.qk_norm_rope import QKNormRopeConfig, QKNormRopeProblem
from cutetune.kernels.registry import (
    DeviceCompile,
    KernelDef,
    NotApplicableError,
    Tensors,
    compare,
    register,
)
from cutetune.spaces.models import ModelShape
from cutetune.spaces.space import Constraint, Space

FP8 = "float8_e4m3fn"
FP8_MAX = 448.0
SLOT_BYTES = 8  # slot_mapping is int64, as vLLM passes it
# The block size of the problems a model gets: vLLM's default for CUDA.
BLOCK_SIZE = 16
# An FP8 e4m3 value holds 3 bits of mantissa: a rounding is off by up to 2^-4 of itself, and by
# up to half its smallest step, 2^-10, near zero (in units of the scale).
FP8_ROUNDING = (2.0 ** -4, 2.0 ** -10)


@dataclass(frozen=True, kw_only=True)
class QKNormRopeKVProblem(QKNormRopeProblem):
    kv_cache_dtype: str
    block_size: int

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kv_cache_dtype not in (self.dtype, FP8):
            raise ValueError(f"kv_cache_dtype {self.kv_cache_dtype!r} must be {FP8} or the "
                             f"dtype of q and k ({self.dtype})")
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {self.block_size!r}")

    @property
    def fp8(self) -> bool:
        return self.kv_cache_dtype == FP8

    @property
    def fused(self) -> QKNormRopeProblem:
        """The norm and rotation's part of the problem, as qk_norm_rope states it."""
        fields = {name: getattr(self, name) for name in QKNormRopeProblem.static_names()}
        return QKNormRopeProblem(num_tokens=self.num_tokens, **fields)


CACHE_TORCH_DTYPES = {**TORCH_DTYPES, FP8: torch.float8_e4m3fn}
CACHE_BYTES = {**DTYPE_BYTES, FP8: 1}


def _v_share(problem: QKNormRopeKVProblem, config: QKNormRopeConfig) -> int:
    """fp32 values of v's head a k head's thread holds across the shuffles (its loads are
    issued before them)."""
    return problem.head_dim // qk_norm_rope._threads_per_head(config)


def _elements_per_thread(problem: QKNormRopeKVProblem, config: QKNormRopeConfig) -> int:
    return qk_norm_rope._elements_per_thread(problem, config) + _v_share(problem, config)


def _registers_per_thread(problem: QKNormRopeKVProblem, config: QKNormRopeConfig) -> int:
    return qk_norm_rope._registers_per_thread(problem, config) + _v_share(problem, config)


# qk_norm_rope's space, its two register limits counting v's share too.
HELD = ("thread_fits_registers", "block_fits_register_file")
SPACE = Space(
    config_type=QKNormRopeConfig,
    params=qk_norm_rope.SPACE.params,
    constraints=(
        *(c for c in qk_norm_rope.SPACE.constraints if c.name not in HELD),
        Constraint(
            "thread_fits_registers",
            f"a thread may hold at most {MAX_ELEMENTS_PER_THREAD} values of its head, their cos "
            "and sin, and v's head",
            lambda p, c, d: _elements_per_thread(p, c) <= MAX_ELEMENTS_PER_THREAD,
        ),
        block_fits_register_file(_registers_per_thread),
    ),
)


def default_config(problem: QKNormRopeKVProblem, device) -> QKNormRopeConfig:
    """qk_norm_rope's seed heuristic over this space."""
    return qk_norm_rope.default_config(problem, device, SPACE)


def cost(problem: QKNormRopeKVProblem, config: QKNormRopeConfig, device) -> Cost:
    fused = qk_norm_rope.cost(problem.fused, config, device)
    elements = problem.num_tokens * problem.kv_heads * problem.head_dim
    # Beside qk_norm_rope's: v read once, k and v written once each into the caches, the slots
    # read once (every thread of a k head loads its token's slot; the cache lines serve them).
    return replace(fused, bytes_moved=(fused.bytes_moved
                                       + elements * DTYPE_BYTES[problem.dtype]
                                       + 2 * elements * CACHE_BYTES[problem.kv_cache_dtype]
                                       + problem.num_tokens * SLOT_BYTES),
                   registers_per_thread=_registers_per_thread(problem, config),
                   # v's share of a k head loads beside k's.
                   bytes_in_flight_per_thread=(fused.bytes_in_flight_per_thread
                                               + _v_share(problem, config)
                                               * DTYPE_BYTES[problem.dtype]))


# ---------------------------------------------------------------------------------------------
# The launch (the kernel, its launcher and its compile are device/qk_norm_rope_kv.py)


def launch(compiled, tensors: Tensors) -> None:
    compiled(tensors["positions"], tensors["q"], tensors["k"], tensors["v"],
             tensors["q_weight"], tensors["k_weight"], tensors["cos_sin_cache"],
             tensors["slot_mapping"], tensors["key_cache"], tensors["value_cache"],
             tensors["k_scale"], tensors["v_scale"])


# ---------------------------------------------------------------------------------------------
# Reference, inputs, check, model problems


def _written(cache: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor,
             scale: torch.Tensor, fp8: bool) -> torch.Tensor:
    """The cache (fp32, in its own units) with `rows` (tokens, heads, head_dim) written at the
    slots of the tokens whose slot is not -1 (divided by the scale and saturated where FP8)."""
    flat = cache.float().flatten(0, 1)
    values = rows.float()
    if fp8:
        # Rounded to FP8 saturating, as the kernel's conversion (and vLLM's) rounds.
        values = (values / scale.float()).clamp(-FP8_MAX, FP8_MAX)
    # A skipped token writes to one spare row past the cache, dropped after: no selection of
    # the kept tokens, whose count only the device knows (a CUDA graph, in which the bench times
    # the reference, cannot capture a shape read back from the device).
    spare = torch.cat((flat, flat[:1]))
    spare[torch.where(slots >= 0, slots, flat.shape[0])] = values
    return spare[:-1].view_as(cache)


def reference(tensors: Tensors, problem: QKNormRopeKVProblem) -> dict[str, torch.Tensor]:
    """qk_norm_rope's reference of q and k, and the caches in fp32, in their own units (divided
    by the scale where FP8), the slots of -1 skipped: k's cache rows from k in q's dtype, as the
    kernel stores it, v's from v; the scales the check reads the caches' units by (the outputs
    a bench hands the check are the kernel's outputs alone)."""
    expected = qk_norm_rope.reference(tensors, problem.fused)
    k_stored = expected["k"].to(TORCH_DTYPES[problem.dtype])
    slots = tensors["slot_mapping"]
    return {**expected,
            "key_cache": _written(tensors["key_cache"], k_stored, slots, tensors["k_scale"],
                                  problem.fp8),
            "value_cache": _written(tensors["value_cache"], tensors["v"], slots,
                                    tensors["v_scale"], problem.fp8),
            "k_scale": tensors["k_scale"], "v_scale": tensors["v_scale"]}


def check(outputs: Tensors, expected: dict[str, torch.Tensor],
          problem: QKNormRopeKVProblem) -> None:
    """q and k within qk_norm_rope's tolerance; the caches times their scales (where FP8)
    within it and FP8's rounding, so that the tolerance is in the units of k and v. A slot not
    written is its own value, which this holds to the same bound."""
    rtol, atol = qk_norm_rope.TOLERANCE[problem.dtype]
    for name in ("q", "k"):
        compare(name, outputs[name], expected[name], rtol, atol)
    for name, scale_name in (("key_cache", "k_scale"), ("value_cache", "v_scale")):
        scale = expected[scale_name].float() if problem.fp8 else torch.ones(())
        tolerance = ((rtol + FP8_ROUNDING[0], atol + FP8_ROUNDING[1] * float(scale))
                     if problem.fp8 else (rtol, atol))
        compare(name, outputs[name].float() * scale, expected[name] * scale, *tolerance)


def make_inputs(problem: QKNormRopeKVProblem, device, generator: torch.Generator) -> Tensors:
    """qk_norm_rope's inputs, v as the third view of the same fused qkv buffer, and caches of
    a few more slots than tokens filled with values far from any k or v (so a slot written
    that should not be, or one missed, fails); each token's slot drawn at random, distinct,
    about one in four of them -1. FP8 scales drawn so that no k or v of the inputs saturates."""
    tensors = qk_norm_rope.make_inputs(problem, device, generator)
    k = tensors["k"]
    v = k.as_strided(k.shape, k.stride(), k.storage_offset() + problem.kv_heads * problem.head_dim)
    blocks = -(-problem.num_tokens // problem.block_size) + 2
    slots = torch.randperm(blocks * problem.block_size, generator=generator,
                           device=device)[:problem.num_tokens]
    padding = torch.rand(problem.num_tokens, generator=generator, device=device) < 0.25
    slots = torch.where(padding, -1, slots)
    cache_dtype = CACHE_TORCH_DTYPES[problem.kv_cache_dtype]
    shape = (2, blocks, problem.block_size, problem.kv_heads, problem.head_dim)
    garbage = 100.0 + torch.rand(shape, generator=generator, device=device)
    caches = garbage.to(cache_dtype)
    # Normalised k reaches about 32 and v about 6 at 2^25 draws: scaled, below FP8_MAX.
    scales = (torch.tensor([0.1, 0.02], device=device)
              + torch.rand(2, generator=generator, device=device) * torch.tensor(
                  [0.05, 0.01], device=device))
    return {**tensors, "v": v, "slot_mapping": slots.to(torch.int64), "key_cache": caches[0],
            "value_cache": caches[1], "k_scale": scales[:1].clone(),
            "v_scale": scales[1:].clone()}


def problems_for_model(model: ModelShape, dtype: str) -> list[QKNormRopeKVProblem]:
    """qk_norm_rope's problems of the model, of vLLM's default block size, with the cache the
    checkpoint states (ModelShape.kv_cache_dtype), else with each the engine may choose: one in
    the model's dtype (vLLM's default) and one in FP8."""
    caches = (dtype, FP8) if model.kv_cache_dtype is None else (model.kv_cache_dtype,)
    if any(cache not in (dtype, FP8) for cache in caches):
        raise NotApplicableError(f"model {model.name} states a {model.kv_cache_dtype} KV cache; "
                                 f"qk_norm_rope_kv writes {dtype} or {FP8}")
    return [QKNormRopeKVProblem(**{**fused.static_fields(), "num_tokens": 1},
                                kv_cache_dtype=cache, block_size=BLOCK_SIZE)
            for fused in qk_norm_rope.problems_for_model(model, dtype)
            for cache in caches]


KERNEL = register(KernelDef(
    name="qk_norm_rope_kv",
    description="qk_norm_rope of q and k in place, and k and v written into a paged KV cache "
                "(bf16 or FP8), in one launch",
    problem_type=QKNormRopeKVProblem,
    space=SPACE,
    problems_for_model=problems_for_model,
    default_config=default_config,
    cost=cost,
    compile_function=DeviceCompile("cutetune.kernels.device.qk_norm_rope_kv"),
    launch=launch,
    make_inputs=make_inputs,
    reference=reference,
    outputs=("q", "k", "key_cache", "value_cache"),
    written_in_place=("q", "k", "key_cache", "value_cache"),
    tolerance=qk_norm_rope.TOLERANCE,
    check=check,
    source_file=__file__,
))
