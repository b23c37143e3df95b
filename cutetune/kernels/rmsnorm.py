"""RMSNorm over rows of the hidden size, optionally fused with the residual add before it.

    y = (w + WEIGHT_BIAS) * x * rsqrt(mean(x^2) + EPS)                  plain
    residual += x;  y = norm(residual)                                  fused_add

The fused form follows vLLM's fused_add_rms_norm: the sum is rounded to the input dtype, stored
into `residual` in place, and that rounded sum is what gets normalised. `out` may have a
different dtype than x (e.g. bf16 in, fp32 out). x is (rows, hidden); x, residual and out may
have row strides larger than hidden. The row count and the row strides are dynamic, so one
compile serves every call of a model; hidden, dtypes, EPS, WEIGHT_BIAS and the fused add are
compile-time constants.

Two forms (the config's `form`):
- block_per_row (prefill, large hidden): one block of WARPS warps per row. The squared sum is
  reduced by butterfly shuffles within each warp, then across warps through a WARPS-float shared
  buffer and one block barrier.
- warp_per_row (decode, small hidden): one warp per row, WARPS rows per block; shuffles only.

Work split: the THREADS threads of a row own vectors lane, lane + THREADS, ... of it, so each
load instruction of a warp is coalesced. When the row's vectors do not divide evenly among the
threads, the last vector slot is predicated: its load is clamped to the row's last vector (every
address stays inside the row) and its contribution and store are dropped.

The config's cache_hints (cache_hints.py) chooses plain or streaming (evict-first) accesses to x,
residual and out, or loads of x and residual under L1 and L2 evict_last policies with plain
stores (what draws the fused add on calls many times the L2 level with torch.compile's
Inductor kernel on the H200: docs/performance-notes.md, RMSNorm); the weight,
which every row reads again, always keeps plain loads. The tuner picks per shape; the
heuristic default picks by the bytes the call moves against the L2 (default_cache_hints).

The module runs past 500 lines because its two forms are one kernel body (the form decides, at
compile time, whether a row's reduction crosses warps) sharing one space and one heuristic, and
its reference, inputs and peers (quack, liger) sit beside them as every kernel's do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cutetune.kernels import cache_hints
from cutetune.kernels.block_limits import (
    MAX_ELEMENTS_PER_THREAD,
    MAX_VECTORS_PER_THREAD,
    WARP,
    block_fits_register_file,
    block_size_within_device,
    estimated_registers,
)
from cutetune.kernels.cost import Cost
from cutetune.kernels.dtypes import (
    DTYPE_BYTES,
    FLOAT_TOLERANCE,
    TORCH_DTYPES,
)
from cutetune.kernels.registry import (
    DeviceCompile,
    KernelDef,
    Peer,
    PeerUnavailable,
    Tensors,
    register,
)
from cutetune.spaces.models import ModelShape
from cutetune.spaces.problem import Problem
from cutetune.spaces.space import Constraint, Param, Space

# Down to 64 so that per-head norms (head dims 64, 128, 256) can run on this kernel too, to
# compare it with qk_norm on the same head tensors (docs/performance-notes.md, QK-norm).
MIN_HIDDEN, MAX_HIDDEN = 64, 16384
BLOCK_PER_ROW, WARP_PER_ROW = "block_per_row", "warp_per_row"
# The narrowest access: one 32-bit word.
MIN_VECTOR_BITS = 32
CACHE_HINTS = (*cache_hints.CACHE_HINTS, cache_hints.EVICT_LAST_LOADS)


@dataclass(frozen=True, kw_only=True)
class RMSNormProblem(Problem):
    dtype: str
    out_dtype: str
    hidden: int
    eps: float
    weight_bias: float
    fused_add: bool

    def __post_init__(self) -> None:
        super().__post_init__()
        for field, value in (("dtype", self.dtype), ("out_dtype", self.out_dtype)):
            if value not in TORCH_DTYPES:
                raise ValueError(f"{field} {value!r} not supported: use "
                                 f"{', '.join(TORCH_DTYPES)}")
        if (not isinstance(self.hidden, int) or isinstance(self.hidden, bool)
                or not MIN_HIDDEN <= self.hidden <= MAX_HIDDEN):
            raise ValueError(f"hidden {self.hidden!r} not supported: use {MIN_HIDDEN} to "
                             f"{MAX_HIDDEN}")
        if not self.eps > 0:
            raise ValueError(f"eps must be positive, got {self.eps}")
        if self.weight_bias not in (0.0, 1.0):
            raise ValueError(f"weight_bias must be 0 or 1 (Gemma-style), got {self.weight_bias}")
        if not isinstance(self.fused_add, bool):
            raise ValueError(f"fused_add must be a bool, got {self.fused_add!r}")


@dataclass(frozen=True)
class RMSNormConfig:
    form: str
    vector_bits: int
    warps_per_block: int
    # Stored winners that lack this field are points of plain accesses.
    cache_hints: str = cache_hints.NORMAL


def _widest_bytes(problem: RMSNormProblem) -> int:
    return max(DTYPE_BYTES[problem.dtype], DTYPE_BYTES[problem.out_dtype])


def _vector_elements(problem: RMSNormProblem, config: RMSNormConfig) -> int:
    # vector_bits is the width of the widest access: x, residual and out each move VEC elements
    # per access, so with out wider than x (bf16 -> fp32) the stores are 128-bit and the loads
    # 64-bit, and every access is one whole aligned vector of its own dtype.
    return config.vector_bits // (8 * _widest_bytes(problem))


def _threads_per_row(config: RMSNormConfig) -> int:
    return config.warps_per_block * WARP if config.form == BLOCK_PER_ROW else WARP


def _vectors_per_row(problem: RMSNormProblem, config: RMSNormConfig) -> int:
    return problem.hidden // _vector_elements(problem, config)


def _vectors_per_thread(problem: RMSNormProblem, config: RMSNormConfig) -> int:
    return -(-_vectors_per_row(problem, config) // _threads_per_row(config))


def _elements_per_thread(problem: RMSNormProblem, config: RMSNormConfig) -> int:
    return _vectors_per_thread(problem, config) * _vector_elements(problem, config)


def _registers_per_thread(problem: RMSNormProblem, config: RMSNormConfig) -> int:
    # The row's and the weight's shares in fp32.
    return estimated_registers(2 * _elements_per_thread(problem, config))


def _rows_per_block(config: RMSNormConfig) -> int:
    return 1 if config.form == BLOCK_PER_ROW else config.warps_per_block


SPACE = Space(
    config_type=RMSNormConfig,
    params=(
        Param("form", (BLOCK_PER_ROW, WARP_PER_ROW),
              "one block per row (cross-warp reduction) or one warp per row (shuffles only)"),
        Param("vector_bits", (32, 64, 128), "bits of the widest global access per thread"),
        Param("warps_per_block", (1, 2, 4, 8, 16, 32),
              "warps in one thread block: a row's warps (block_per_row) or its rows "
              "(warp_per_row)"),
        cache_hints.cache_hints_param(CACHE_HINTS),
    ),
    constraints=(
        Constraint(
            "vector_holds_whole_elements",
            "a vector must hold at least one element of the widest of dtype and out_dtype",
            lambda p, c, d: _vector_elements(p, c) >= 1,
        ),
        Constraint(
            "hidden_splits_into_vectors",
            "hidden must be a multiple of the vector's element count",
            lambda p, c, d: p.hidden % _vector_elements(p, c) == 0,
        ),
        Constraint(
            "no_idle_threads",
            "every thread of a row must own at least one vector (no more threads per row "
            "than vectors in it)",
            lambda p, c, d: _threads_per_row(c) <= _vectors_per_row(p, c),
        ),
        Constraint(
            "row_fits_one_warp",
            f"warp_per_row needs the row within one warp's registers "
            f"(at most {MAX_ELEMENTS_PER_THREAD} elements per lane)",
            lambda p, c, d: c.form != WARP_PER_ROW
            or _elements_per_thread(p, c) <= MAX_ELEMENTS_PER_THREAD,
        ),
        Constraint(
            "row_fits_registers",
            f"a thread may hold at most {MAX_ELEMENTS_PER_THREAD} elements of its row",
            lambda p, c, d: _elements_per_thread(p, c) <= MAX_ELEMENTS_PER_THREAD,
        ),
        Constraint(
            "vectors_per_thread_unrollable",
            f"a thread may make at most {MAX_VECTORS_PER_THREAD} vector accesses per tensor",
            lambda p, c, d: _vectors_per_thread(p, c) <= MAX_VECTORS_PER_THREAD,
        ),
        Constraint(
            "evict_last_loads_whole_words",
            "evict_last_loads loads 32-bit words: each load of x must be at least one word (not "
            "a single 16-bit element, as bf16 rows with an fp32 output at 32-bit vectors have)",
            lambda p, c, d: cache_hints.loads_with(
                c.cache_hints, _vector_elements(p, c) * 8 * DTYPE_BYTES[p.dtype]),
        ),
        block_size_within_device(),
        block_fits_register_file(_registers_per_thread),
    ),
)

# The seed heuristic's target: vectors each thread of a block_per_row row loads before the
# reduction (4 x 16 bytes in flight per thread at 128 bits).
TARGET_VECTORS_PER_THREAD = 4
# Up to DECODE_MAX_TOKENS rows a call is a memory round trip or two deep, and the fewer vectors
# each thread loads and reduces, the sooner it ends. So such calls aim at about 2 vectors per
# thread (the warps rounded to the nearest power of two) rather than the seed's 4: on the H200
# the doubled warps are faster on nearly every decode-sized row of the preset widths, and at
# hidden 5120, where doubling is slower, the rounding keeps the seed's warps
# (docs/performance-notes.md, RMSNorm: default block size).
DECODE_MAX_TOKENS = 128
DECODE_VECTORS_PER_THREAD = 2


# The heuristic default's cache hints, from the default point of every preset width (bf16,
# plain and fused add) timed under each hint on the H200 (docs/performance-notes.md, RMSNorm:
# cache hints):
# - calls that move at most twice the L2: streaming is faster than plain accesses or level with
#   them (at 1 and 8 tokens every hint is level);
# - rows of 8 KiB or more in calls that move at least 8x the L2: evict_last_loads is faster than
#   plain; with smaller rows it is slower there;
# - in between, plain accesses are about level with the best hint.
STREAMING_MAX_L2_MULTIPLE = 2
EVICT_LAST_MIN_L2_MULTIPLE = 8
EVICT_LAST_MIN_ROW_BYTES = 8192


def _bytes_moved(problem: RMSNormProblem) -> int:
    in_bytes, out_bytes = DTYPE_BYTES[problem.dtype], DTYPE_BYTES[problem.out_dtype]
    # x read, out written; the fused add also reads and writes the residual; the weight once.
    per_element = in_bytes + out_bytes + (2 * in_bytes if problem.fused_add else 0)
    return problem.num_tokens * problem.hidden * per_element + problem.hidden * in_bytes


def default_cache_hints(problem: RMSNormProblem, device) -> str:
    moved = _bytes_moved(problem)
    if moved <= STREAMING_MAX_L2_MULTIPLE * device.l2_bytes:
        return cache_hints.STREAMING
    if (moved >= EVICT_LAST_MIN_L2_MULTIPLE * device.l2_bytes
            and problem.hidden * DTYPE_BYTES[problem.dtype] >= EVICT_LAST_MIN_ROW_BYTES):
        return cache_hints.EVICT_LAST_LOADS
    return cache_hints.NORMAL


def default_config(problem: RMSNormProblem, device) -> RMSNormConfig:
    """The seed heuristic: the widest access that divides the row (128-bit where it can). A
    row that fits one warp at a few vectors per lane gets warp_per_row, one warp per block
    while the rows fit one per SM, else 8 rows per block; a larger row gets a block of
    enough warps that each thread loads about four vectors, or about two in calls of at most
    DECODE_MAX_TOKENS rows. Cache hints by the bytes the call moves (default_cache_hints).
    Falls back to the nearest valid point, and raises EmptySpaceError naming the constraints
    when there is none."""
    enumeration = SPACE.enumerate(problem, device)
    enumeration.raise_if_empty(problem.describe())
    valid = enumeration.valid
    bits = max(c.vector_bits for c in valid)
    vectors = problem.hidden // (bits // (8 * _widest_bytes(problem)))
    if vectors <= WARP * TARGET_VECTORS_PER_THREAD:
        form = WARP_PER_ROW
        warps = 1 if problem.num_tokens <= device.sm_count else 8
    else:
        form = BLOCK_PER_ROW
        decode = problem.num_tokens <= DECODE_MAX_TOKENS
        per_thread = DECODE_VECTORS_PER_THREAD if decode else TARGET_VECTORS_PER_THREAD
        exponent = math.log2(vectors / (WARP * per_thread))
        warps = 1 << max(0, round(exponent) if decode else math.ceil(exponent))
    hints = default_cache_hints(problem, device)
    preferred = RMSNormConfig(form, bits, warps, hints)
    if preferred in valid:
        return preferred

    def distance(c: RMSNormConfig) -> tuple:
        return (c.vector_bits != bits, c.form != form,
                abs(math.log2(c.warps_per_block) - math.log2(warps)), -c.warps_per_block,
                c.cache_hints != hints)

    return min(valid, key=distance)


def _blocks(problem: RMSNormProblem, config: RMSNormConfig) -> int:
    return -(-problem.num_tokens // _rows_per_block(config))


def cost(problem: RMSNormProblem, config: RMSNormConfig, device) -> Cost:
    elements = problem.num_tokens * problem.hidden
    in_bytes = DTYPE_BYTES[problem.dtype]
    threads = config.warps_per_block * WARP
    return Cost(
        bytes_moved=_bytes_moved(problem),
        # Square, accumulate, scale by rsqrt, scale by the weight (and the add): per element.
        flops=(5 if problem.fused_add else 4) * elements,
        blocks=_blocks(problem, config),
        threads_per_block=threads,
        registers_per_thread=_registers_per_thread(problem, config),
        smem_per_block=4 * config.warps_per_block if (
            config.form == BLOCK_PER_ROW and config.warps_per_block > 1) else 0,
        # x (and the residual) loaded before the reduction.
        bytes_in_flight_per_thread=_elements_per_thread(problem, config) * in_bytes
        * (2 if problem.fused_add else 1),
    )


# ---------------------------------------------------------------------------------------------
# The launch (the kernel, its launcher and its compile are device/rmsnorm.py)


def launch(compiled, tensors: Tensors) -> None:
    compiled(tensors["x"], tensors["residual"], tensors["weight"], tensors["out"])


# ---------------------------------------------------------------------------------------------
# Reference, inputs, model problems, peers


def reference(tensors: Tensors, problem: RMSNormProblem) -> dict[str, torch.Tensor]:
    """fp32 RMSNorm of x, or of the residual sum rounded to the input dtype (vLLM's
    contract); `residual`: x + residual in fp32 when fused, else the input unchanged."""
    x = tensors["x"].float()
    residual = tensors["residual"].float()
    if problem.fused_add:
        residual = x + residual
        x = residual.to(TORCH_DTYPES[problem.dtype]).float()
    inv_rms = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + problem.eps)
    out = (tensors["weight"].float() + problem.weight_bias) * (x * inv_rms)
    return {"out": out, "residual": residual}


def make_inputs(problem: RMSNormProblem, device, generator: torch.Generator) -> Tensors:
    """Contiguous rows, the way engines hold hidden states. The plain form gets a residual too
    (KernelDef.outputs is one tuple for both forms): it must come back untouched."""
    dtype = TORCH_DTYPES[problem.dtype]
    shape = (problem.num_tokens, problem.hidden)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=generator, device=device, dtype=torch.float32)

    return {
        "x": randn(*shape).to(dtype),
        "residual": randn(*shape).to(dtype),
        "weight": (1.0 + 0.5 * randn(problem.hidden)).to(dtype),
        "out": torch.empty(shape, device=device, dtype=TORCH_DTYPES[problem.out_dtype]),
    }


def problems_for_model(model: ModelShape, dtype: str) -> list[RMSNormProblem]:
    """Every RMSNorm of the model: the hidden size plain (final norm) and fused with the
    residual add (every layer's input and post-attention norms), and each extra width plain
    (DeepSeek-V3's q and kv low-rank norms), with the eps it is built with."""
    def problem(hidden: int, fused_add: bool, eps: float) -> RMSNormProblem:
        return RMSNormProblem(num_tokens=1, dtype=dtype, out_dtype=dtype, hidden=hidden,
                              eps=eps, weight_bias=model.norm_weight_bias, fused_add=fused_add)

    extra_eps = model.extra_norm_eps or model.rms_norm_eps
    return ([problem(model.hidden_size, False, model.rms_norm_eps),
             problem(model.hidden_size, True, model.rms_norm_eps)]
            + [problem(width, False, extra_eps) for width in model.extra_norm_widths])


def _quack_peer(problem: RMSNormProblem):
    """quack's rmsnorm_fwd, with its residual for the fused form (the sum comes back as a new
    tensor rather than updating the residual in place)."""
    try:
        from quack.rmsnorm import rmsnorm_fwd
    except ImportError as err:
        raise PeerUnavailable(f"quack is not installed ({err})") from None
    if problem.fused_add and problem.out_dtype != problem.dtype:
        # quack normalises the fp32 sum, vLLM's contract the sum rounded to the input dtype:
        # the two differ by up to half an input ulp, hidden by an output of the input's
        # precision but not by a wider one.
        raise PeerUnavailable("quack normalises the unrounded residual sum, which differs "
                              "from the rounded sum at a wider out_dtype")
    out_dtype = TORCH_DTYPES[problem.out_dtype]
    eps, bias = problem.eps, problem.weight_bias
    if problem.fused_add:
        def run(t: Tensors) -> dict:
            out, residual, _ = rmsnorm_fwd(t["x"], t["weight"], residual=t["residual"],
                                           out_dtype=out_dtype, eps=eps, weight_offset=bias)
            return {"out": out, "residual": residual}
    else:
        def run(t: Tensors) -> dict:
            out, _, _ = rmsnorm_fwd(t["x"], t["weight"], out_dtype=out_dtype, eps=eps,
                                    weight_offset=bias)
            return {"out": out, "residual": t["residual"]}
    return run


def _liger_peer(problem: RMSNormProblem):
    """liger's rms_norm, or its fused_add_rms_norm for the fused form."""
    try:
        from liger_kernel.ops.fused_add_rms_norm import fused_add_rms_norm_forward
        from liger_kernel.ops.rms_norm import rms_norm_forward
    except ImportError as err:
        raise PeerUnavailable(f"liger-kernel is not installed ({err})") from None
    if problem.out_dtype != problem.dtype:
        raise PeerUnavailable("liger writes the output in the input dtype only")
    eps, bias = problem.eps, problem.weight_bias
    # "gemma" casting computes in fp32 throughout and rounds once, as ours and the reference
    # do. Liger's fused add rounds the sum to the input dtype and normalises that, as vLLM; it
    # returns the sum as a new tensor rather than updating the residual in place.
    if problem.fused_add:
        def run(t: Tensors) -> dict:
            out, residual = fused_add_rms_norm_forward(t["x"], t["residual"], t["weight"], eps,
                                                       bias, "gemma")[:2]
            return {"out": out, "residual": residual}
    else:
        def run(t: Tensors) -> dict:
            out = rms_norm_forward(t["x"], t["weight"], eps, bias, "gemma", None)[0]
            return {"out": out, "residual": t["residual"]}
    return run


KERNEL = register(KernelDef(
    name="rmsnorm",
    description="RMSNorm over rows of the hidden size, optionally fused with the residual add",
    problem_type=RMSNormProblem,
    space=SPACE,
    problems_for_model=problems_for_model,
    default_config=default_config,
    cost=cost,
    compile_function=DeviceCompile("cutetune.kernels.device.rmsnorm"),
    launch=launch,
    make_inputs=make_inputs,
    reference=reference,
    outputs=("out", "residual"),
    written_in_place=("residual",),
    tolerance=FLOAT_TOLERANCE,
    source_file=__file__,
    peers=(Peer("quack rmsnorm", _quack_peer), Peer("liger rms_norm", _liger_peer)),
))
