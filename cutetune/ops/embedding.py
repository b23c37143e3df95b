"""cutetune.embedding: token embedding lookup of this rank's rows, vocab-parallel."""

from __future__ import annotations

import torch

from cutetune.fast_call import Dim, DType, FastCall, Value
from cutetune.kernels.dtypes import DTYPE_BYTES, DTYPE_NAMES
from cutetune.kernels.embedding import KERNEL, EmbeddingProblem
from cutetune.ops.checks import device_index, is_int
from cutetune.ops.registry import Checked, CustomOp, OpDef, register

ID_DTYPE_NAMES = {torch.int32: "int32", torch.int64: "int64"}


def _check_inputs(ids: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None,
                  error: torch.Tensor | None, vocab_start: int, vocab_end: int,
                  vocab_size: int) -> int:
    """Raise one clear error, naming the argument, for the first thing wrong with the inputs;
    return weight's CUDA device index (-1: the CPU). Any config of the space may serve the
    call, so a row stride other than hidden is held to 16 bytes, the widest vector; ids that
    lie outside the vocabulary cannot be seen without waiting for the device: the kernel
    flags them in `error`."""
    for name, t in (("ids", ids), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ids.dtype not in ID_DTYPE_NAMES:
        raise TypeError(f"ids has dtype {ids.dtype}: use torch.int32 or torch.int64")
    dtype = weight.dtype
    if dtype not in DTYPE_NAMES:
        raise TypeError(f"weight has dtype {dtype}: use one of "
                        f"{', '.join(str(d) for d in DTYPE_NAMES)}")
    if ids.dim() != 1 or not ids.is_contiguous():
        raise ValueError(f"ids must be a contiguous (tokens,) tensor, got shape "
                         f"{tuple(ids.shape)} and strides {ids.stride()}")
    if weight.dim() != 2 or 0 in weight.shape:
        raise ValueError(f"weight must be a (rows, hidden) table of at least one row, got shape "
                         f"{tuple(weight.shape)}")
    hidden = weight.shape[1]
    element_bytes = DTYPE_BYTES[DTYPE_NAMES[dtype]]
    if hidden * element_bytes % 4:
        raise ValueError(f"hidden {hidden} (weight.shape[1]) must be a multiple of 4 bytes "
                         f"({4 // element_bytes} elements of {dtype}), the narrowest vector")
    _check_rows("weight", weight, hidden, element_bytes)
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
        if out.dtype is not dtype:
            raise TypeError(f"out has dtype {out.dtype} but weight has {dtype}: they must match")
        if tuple(out.shape) != (ids.shape[0], hidden):
            raise ValueError(f"out must be (tokens, hidden) = {(ids.shape[0], hidden)}, got "
                             f"{tuple(out.shape)}")
        _check_rows("out", out, hidden, element_bytes)
    if error is not None:
        if not isinstance(error, torch.Tensor):
            raise TypeError(f"error must be a torch.Tensor, got {type(error).__name__}")
        if error.dtype is not torch.int32 or tuple(error.shape) != (1,):
            raise TypeError(f"error must be a (1,) torch.int32 tensor, got {error.dtype} of "
                            f"shape {tuple(error.shape)}")
    for name, value in (("vocab_start", vocab_start), ("vocab_end", vocab_end),
                        ("vocab_size", vocab_size)):
        if not is_int(value):
            raise TypeError(f"{name} must be an int, got {value!r}")
    if not 0 <= vocab_start < vocab_end <= vocab_size:
        raise ValueError(f"[vocab_start, vocab_end) must be a non-empty range within "
                         f"[0, vocab_size): got [{vocab_start}, {vocab_end}) and vocab_size "
                         f"{vocab_size}")
    return device_index("embedding", "weight", weight,
                        (("ids", ids), ("out", out), ("error", error)))


def _check_rows(name: str, t: torch.Tensor, hidden: int, element_bytes: int) -> None:
    stride = t.stride()
    if stride[1] != 1:
        raise ValueError(f"the rows of {name} must be contiguous (strides (*, 1)), got strides "
                         f"{stride}")
    if stride[0] != hidden and stride[0] * element_bytes % 16:
        raise ValueError(f"the row stride of {name} ({stride[0]} elements) must be hidden "
                         f"({hidden}) or a multiple of 16 bytes")
    if t.data_ptr() % 16:
        raise ValueError(f"{name} must start 16-byte aligned")


def embedding(ids: torch.Tensor, weight: torch.Tensor, vocab_start: int = 0,
              vocab_end: int | None = None, vocab_size: int | None = None,
              out: torch.Tensor | None = None,
              error: torch.Tensor | None = None) -> torch.Tensor:
    """The rows of `ids` (tokens,), int32 or int64, looked up in this rank's table `weight`
    (rows, hidden), in one launch on the current stream: out[t] = weight[ids[t] - vocab_start]
    for the ids this rank holds, [vocab_start, vocab_end), and a zero row for every other id,
    so that summing the ranks' outputs (an all-reduce) gives each token its row. Written to
    `out` (tokens, hidden) in weight's dtype (allocated when None) and returned.

    vocab_end defaults to vocab_start + weight.shape[0] (the table is the range; a padded shard
    passes its vocab_end: rows past the range are never read); vocab_size, the whole
    vocabulary, defaults to vocab_end (one GPU's table: vocab_start 0). An id outside
    [0, vocab_size), or one of the range past the table's rows, gets a zero row and sets
    `error` (a (1,) torch.int32 tensor) to 1 on the device; the op never clears it, so one flag
    can watch many calls: zero it when you read it. Without `error` the op zeroes a flag of
    its own each call, which the caller does not see.

    The kernel is the winner tuned for this device and token bucket when `cutetune.warmup`
    loaded one, else the heuristic default. On CPU tensors the op computes with the kernel's
    reference instead. Under torch.compile the call is the custom op cutetune::embedding."""
    # Where the defaults cannot be computed they stay None, and the checks name what is wrong.
    if (vocab_end is None and isinstance(weight, torch.Tensor) and weight.dim() == 2
            and isinstance(vocab_start, int)):
        vocab_end = vocab_start + weight.shape[0]
    if vocab_size is None:
        vocab_size = vocab_end
    return _EMBEDDING((ids, weight, out, error, vocab_start, vocab_end, vocab_size))


def _prepared(ids: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None,
              error: torch.Tensor | None, *vocab: int) -> tuple[tuple, torch.Tensor]:
    """The route's arguments, out and error allocated where the caller gave none; the result."""
    if out is None:
        out = weight.new_empty((ids.shape[0], weight.shape[1]))
    if error is None:
        error = torch.zeros(1, dtype=torch.int32, device=weight.device)
    return (ids, weight, out, error, *vocab), out


def _checked(ids: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None,
             error: torch.Tensor | None, vocab_start: int, vocab_end: int, vocab_size: int,
             allocated: torch.Tensor | None) -> Checked:
    device = _check_inputs(ids, weight, out, error, vocab_start, vocab_end, vocab_size)
    tokens = ids.shape[0]
    if out is None:
        out = weight.new_empty((tokens, weight.shape[1])) if allocated is None else allocated
    if tokens == 0:
        return Checked(out)
    if error is None:
        error = torch.zeros(1, dtype=torch.int32, device=weight.device)
    static = EmbeddingProblem.static_tuple_of(
        dtype=DTYPE_NAMES[weight.dtype], hidden=weight.shape[1], vocab_size=vocab_size,
        vocab_start=vocab_start, vocab_end=vocab_end, ids_dtype=ID_DTYPE_NAMES[ids.dtype])
    # The problem's own checks (a vocabulary of 2^31 and more).
    EmbeddingProblem.from_static_tuple(static, tokens)
    return Checked(out, (ids, weight, out, error, vocab_start, vocab_end, vocab_size), static,
                   tokens, device)


def _traced(ids: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None,
            error: torch.Tensor | None, *vocab: int) -> torch.Tensor:
    """The call as torch.compile records it: out and error allocated here, then the custom op
    writes them."""
    arguments, out = _prepared(ids, weight, out, error, *vocab)
    torch.ops.cutetune.embedding(*arguments)
    return out


def _embedding_into(ids: torch.Tensor, weight: torch.Tensor, out: torch.Tensor,
                    error: torch.Tensor, vocab_start: int, vocab_end: int,
                    vocab_size: int) -> None:
    """The custom op's body: the eager op (a compiled graph runs it, not compiling)."""
    embedding(ids, weight, vocab_start, vocab_end, vocab_size, out, error)


# The kernel does not check that the rows it writes do not overlap: the route does. The key
# holds the rank's range and the vocabulary as given, not the table's rows (the kernel reads
# those at each call).
_EMBEDDING = register(OpDef(
    kernel=KERNEL,
    fast_call=FastCall(
        arguments=("ids", "weight", "out", "error", "vocab_start", "vocab_end", "vocab_size"),
        launched=4, tokens=Dim("ids", 0),
        fields={"dtype": DType("weight"), "hidden": Dim("weight", 1),
                "vocab_size": Value("vocab_size"), "vocab_start": Value("vocab_start"),
                "vocab_end": Value("vocab_end"), "ids_dtype": DType("ids")},
        disjoint_rows=("out",)),
    check=_checked,
    functions=(embedding,),
    custom_ops=(CustomOp("embedding", _embedding_into, mutates=("out", "error")),),
    calls=lambda t, problem: {"embedding": lambda: embedding(
        t["ids"], t["weight"], problem.vocab_start, problem.vocab_end, problem.vocab_size,
        out=t["out"], error=t["error"])},
    prepare=_prepared,
    traced=_traced,
))
