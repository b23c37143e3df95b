"""cutetune.embedding_rmsnorm: the token embedding lookup fused with the first layer's input
RMSNorm, the whole vocabulary on one rank."""

from __future__ import annotations

import math

import torch

from cutetune.fast_call import Dim, DType, FastCall, Value
from cutetune.kernels.dtypes import DTYPE_NAMES
from cutetune.kernels.embedding_rmsnorm import KERNEL, EmbeddingRMSNormProblem, rounded_scale
from cutetune.kernels.rmsnorm import MAX_HIDDEN, MIN_HIDDEN
from cutetune.ops import embedding as embedding_op
from cutetune.ops.checks import check_norm_scalars, device_index, is_int, is_number
from cutetune.ops.registry import Checked, CustomOp, OpDef, register


def _check_inputs(ids: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor,
                  residual: torch.Tensor | None, out: torch.Tensor | None,
                  error: torch.Tensor | None, embed_scale: float, vocab_size: int,
                  vocab_start: int, vocab_end: int) -> int:
    """Raise one clear error, naming the argument, for the first thing wrong with the inputs;
    return weight's CUDA device index (-1: the CPU). ids, weight (the table), out, error and
    the vocabulary as cutetune.embedding checks them; then the range (the whole vocabulary),
    the width (rmsnorm's), residual as out, and the norm's weight. eps and weight_bias are
    checked apart (cutetune.ops.checks.check_norm_scalars)."""
    if vocab_size is not None and not is_int(vocab_size):
        # Before embedding's checks, which would name vocab_end, its default. (None: weight
        # is no table, which they name.)
        raise TypeError(f"vocab_size must be an int, got {vocab_size!r}")
    device = embedding_op._check_inputs(ids, weight, out, error, vocab_start, vocab_end,
                                        vocab_size)
    if (vocab_start, vocab_end) != (0, vocab_size):
        raise ValueError(f"embedding_rmsnorm normalises whole rows, so it takes the whole "
                         f"vocabulary [0, {vocab_size}), got [{vocab_start}, {vocab_end}): a "
                         "vocab-parallel rank runs cutetune.embedding, the all-reduce, then "
                         "cutetune.rmsnorm")
    tokens, hidden = ids.shape[0], weight.shape[1]
    if not MIN_HIDDEN <= hidden <= MAX_HIDDEN:
        raise ValueError(f"hidden {hidden} (weight.shape[1]) is not supported: use "
                         f"{MIN_HIDDEN} to {MAX_HIDDEN}")
    if residual is not None:
        if not isinstance(residual, torch.Tensor):
            raise TypeError(f"residual must be a torch.Tensor, got {type(residual).__name__}")
        if residual.dtype is not weight.dtype:
            raise TypeError(f"residual has dtype {residual.dtype} but weight has "
                            f"{weight.dtype}: they must match")
        if tuple(residual.shape) != (tokens, hidden):
            raise ValueError(f"residual must be (tokens, hidden) = {(tokens, hidden)}, got "
                             f"{tuple(residual.shape)}")
        embedding_op._check_rows("residual", residual, hidden, weight.element_size())
    if not isinstance(norm_weight, torch.Tensor):
        raise TypeError(f"norm_weight must be a torch.Tensor, got {type(norm_weight).__name__}")
    if norm_weight.dtype is not weight.dtype:
        raise TypeError(f"norm_weight has dtype {norm_weight.dtype} but weight has "
                        f"{weight.dtype}: they must match")
    if tuple(norm_weight.shape) != (hidden,) or norm_weight.stride() != (1,):
        raise ValueError(f"norm_weight must be a contiguous ({hidden},) vector, got shape "
                         f"{tuple(norm_weight.shape)} and strides {norm_weight.stride()}")
    if norm_weight.data_ptr() % 16:
        raise ValueError("norm_weight must start 16-byte aligned")
    if not is_number(embed_scale):
        raise TypeError(f"embed_scale must be a float, got {embed_scale!r}")
    if not math.isfinite(embed_scale):
        raise ValueError(f"embed_scale must be finite, got {embed_scale!r}")
    device_index("embedding_rmsnorm", "weight", weight,
                 (("residual", residual), ("norm_weight", norm_weight)))
    return device


def embedding_rmsnorm(ids: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor,
                      eps: float = 1e-6, weight_bias: float = 0.0, embed_scale: float = 1.0,
                      vocab_size: int | None = None, vocab_start: int = 0,
                      vocab_end: int | None = None, residual: torch.Tensor | None = None,
                      out: torch.Tensor | None = None, error: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of `ids` (tokens,), int32 or int64, looked up in the embedding table `weight`
    (rows, hidden), multiplied by `embed_scale` in weight's dtype (Gemma's normaliser,
    sqrt(hidden); rounded to that dtype first, as Gemma does), written to `residual`; and
    RMSNorm of those rows, out = (norm_weight + weight_bias) * residual * rsqrt(mean(residual^2)
    + eps) in fp32, written to `out`; one launch on the current stream. residual and out are
    (tokens, hidden) in weight's dtype, allocated when None. Returns (out, residual): the first
    decoder layer's attention input and the residual stream its output is added to.

    The table holds the whole vocabulary, [0, vocab_size) (vocab_size defaults to its rows;
    rows past it, an engine's padding, are never read): vocab_start and vocab_end, as
    cutetune.embedding takes them, must be 0 and vocab_size (their defaults), since a
    vocab-parallel rank's rows are partial until the all-reduce. An id outside
    [0, vocab_size), or past the table's rows, gets zero rows and sets `error` (a (1,)
    torch.int32 tensor) to 1 on the device, as in cutetune.embedding: the op never clears it.

    The kernel is the winner tuned for this device and token bucket when `cutetune.warmup`
    loaded one, else the heuristic default. On CPU tensors the op computes with the kernel's
    reference instead. Under torch.compile the call is the custom op
    cutetune::embedding_rmsnorm."""
    if vocab_size is None and isinstance(weight, torch.Tensor) and weight.dim() == 2:
        vocab_size = weight.shape[0]
    if vocab_end is None:
        vocab_end = vocab_size
    return _EMBEDDING_RMSNORM((ids, weight, norm_weight, residual, out, error, eps, weight_bias,
                               embed_scale, vocab_size, vocab_start, vocab_end))


def _prepared(ids: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor,
              residual: torch.Tensor | None, out: torch.Tensor | None,
              error: torch.Tensor | None, *scalars) -> tuple[tuple, tuple]:
    """The route's arguments, residual, out and error allocated where the caller gave none;
    the result."""
    shape = (ids.shape[0], weight.shape[1])
    if residual is None:
        residual = weight.new_empty(shape)
    if out is None:
        out = weight.new_empty(shape)
    if error is None:
        error = torch.zeros(1, dtype=torch.int32, device=weight.device)
    return (ids, weight, norm_weight, residual, out, error, *scalars), (out, residual)


def _checked(ids: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor,
             residual: torch.Tensor | None, out: torch.Tensor | None,
             error: torch.Tensor | None, eps: float, weight_bias: float, embed_scale: float,
             vocab_size: int, vocab_start: int, vocab_end: int,
             allocated: tuple | None) -> Checked:
    device = _check_inputs(ids, weight, norm_weight, residual, out, error, embed_scale,
                           vocab_size, vocab_start, vocab_end)
    check_norm_scalars(eps, weight_bias)
    tokens, hidden = ids.shape[0], weight.shape[1]
    given_out, given_residual = (None, None) if allocated is None else allocated
    if residual is None:
        residual = weight.new_empty((tokens, hidden)) if given_residual is None else (
            given_residual)
    if out is None:
        out = weight.new_empty((tokens, hidden)) if given_out is None else given_out
    if tokens == 0:
        return Checked((out, residual))
    if error is None:
        error = torch.zeros(1, dtype=torch.int32, device=weight.device)
    dtype = DTYPE_NAMES[weight.dtype]
    static = EmbeddingRMSNormProblem.static_tuple_of(
        dtype=dtype, hidden=hidden, vocab_size=vocab_size,
        ids_dtype=embedding_op.ID_DTYPE_NAMES[ids.dtype], eps=float(eps),
        weight_bias=float(weight_bias), embed_scale=rounded_scale(embed_scale, dtype))
    # The problem's own checks (a vocabulary of 2^31 and more).
    EmbeddingRMSNormProblem.from_static_tuple(static, tokens)
    return Checked((out, residual), (ids, weight, norm_weight, residual, out, error, eps,
                                     weight_bias, embed_scale, vocab_size, vocab_start,
                                     vocab_end), static, tokens, device)


def _traced(ids: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor,
            residual: torch.Tensor | None, out: torch.Tensor | None,
            error: torch.Tensor | None, *scalars) -> tuple[torch.Tensor, torch.Tensor]:
    """The call as torch.compile records it: residual, out and error allocated here, then the
    custom op writes them."""
    arguments, result = _prepared(ids, weight, norm_weight, residual, out, error, *scalars)
    torch.ops.cutetune.embedding_rmsnorm(*arguments)
    return result


def _embedding_rmsnorm_into(ids: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor,
                            residual: torch.Tensor, out: torch.Tensor, error: torch.Tensor,
                            eps: float, weight_bias: float, embed_scale: float,
                            vocab_size: int, vocab_start: int, vocab_end: int) -> None:
    """The custom op's body: the eager op (a compiled graph runs it, not compiling)."""
    embedding_rmsnorm(ids, weight, norm_weight, eps, weight_bias, embed_scale, vocab_size,
                      vocab_start, vocab_end, residual, out, error)


# The kernel does not check that the rows it writes do not overlap: the route does. The key
# holds embed_scale as given (the problem holds it rounded to the table's dtype) and the range,
# which a call outside the whole vocabulary never passes the checks with.
_EMBEDDING_RMSNORM = register(OpDef(
    kernel=KERNEL,
    fast_call=FastCall(
        arguments=("ids", "weight", "norm_weight", "residual", "out", "error", "eps",
                   "weight_bias", "embed_scale", "vocab_size", "vocab_start", "vocab_end"),
        launched=6, tokens=Dim("ids", 0),
        fields={"dtype": DType("weight"), "hidden": Dim("weight", 1),
                "vocab_size": Value("vocab_size"), "ids_dtype": DType("ids"),
                "eps": Value("eps"), "weight_bias": Value("weight_bias"),
                "embed_scale": Value("embed_scale")},
        disjoint_rows=("residual", "out"), keyed=("vocab_start", "vocab_end")),
    check=_checked,
    functions=(embedding_rmsnorm,),
    custom_ops=(CustomOp("embedding_rmsnorm", _embedding_rmsnorm_into,
                         mutates=("residual", "out", "error")),),
    calls=lambda t, problem: {"embedding_rmsnorm": lambda: embedding_rmsnorm(
        t["ids"], t["weight"], t["norm_weight"], problem.eps, problem.weight_bias,
        problem.embed_scale, problem.vocab_size, residual=t["residual"], out=t["out"],
        error=t["error"])},
    prepare=_prepared,
    traced=_traced,
))
