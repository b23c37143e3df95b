"""What MoE dispatch and combine share: the problem, the layout between them, routing inputs for
tests and benchmarks, and the torch reference (sort, index_select, index_add).

The layout, for the local experts [expert_begin, expert_end) (L of them) of E:
- counts (L,) int32: the (token, k) pairs routed to each local expert;
- offsets (L + 1,) int32: expert e's rows start at offsets[e], and
  offsets[e + 1] - offsets[e] = round_up(counts[e], pad), so a grouped GEMM can take each
  segment whole; offsets[L] is the number of rows used;
- row_of (T, K) int32: the row each pair was copied to; -1 for a pair whose expert is not local
  or not in [0, E);
- dispatched (capacity, H): rows [offsets[e], offsets[e] + counts[e]) hold expert e's tokens in
  any order; the padding rows after them up to offsets[e + 1] are zero when the problem asks
  for zero_padding, else left as they were (a grouped GEMM computes each row on its own and
  combine never reads them, so their contents cannot reach a token; filling them is most of
  a decode step's bytes: 15 rows per expert hit at pad 16); the rest untouched;
  capacity = T * K + L * (pad - 1) rows, never a dense (E, T, H) block;
- error (1,) int32: nonzero when some expert id was outside [0, E) (the entry is skipped).

Combine takes the experts' outputs in that layout and writes
out[t] = sum_k topk_weights[t, k] * expert_out[row_of[t, k]] (pairs with row -1 add nothing),
accumulated in fp32 and stored in the input dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cutetune.kernels.registry import NotApplicableError, VerificationError
from cutetune.spaces.models import ModelShape
from cutetune.spaces.problem import Problem

MOE_DTYPES = ("bfloat16", "float16")
# The presets pad each expert's segment to 16 rows: aligned for a grouped GEMM's row tiles
# without multiplying the rows of a decode step (8 experts x 128 rows would copy 1024 rows
# for one token). Callers choose their own.
DEFAULT_PAD = 16
SKEWED_HOT_EXPERTS = 4


@dataclass(frozen=True, kw_only=True)
class MoEProblem(Problem):
    dtype: str
    hidden: int
    experts: int
    top_k: int
    pad: int
    expert_begin: int
    expert_end: int
    # Write zeros into each segment's padding rows (see the layout above).
    zero_padding: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dtype not in MOE_DTYPES:
            raise ValueError(f"dtype {self.dtype!r} not supported: use {', '.join(MOE_DTYPES)}")
        if self.hidden < 1 or self.experts < 1 or self.pad < 1:
            raise ValueError(f"hidden, experts and pad must be positive, got {self.hidden}, "
                             f"{self.experts}, {self.pad}")
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(f"top_k {self.top_k} must be between 1 and the expert count "
                             f"{self.experts}")
        if not 0 <= self.expert_begin < self.expert_end <= self.experts:
            raise ValueError(f"local experts [{self.expert_begin}, {self.expert_end}) must be a "
                             f"non-empty range within [0, {self.experts})")

    @property
    def local_experts(self) -> int:
        return self.expert_end - self.expert_begin

    @property
    def capacity(self) -> int:
        return dispatch_capacity(self.num_tokens, self.top_k, self.local_experts, self.pad)


def dispatch_capacity(tokens: int, top_k: int, local_experts: int, pad: int) -> int:
    """Rows of the dispatched buffer: every pair plus the most padding the segments need."""
    return tokens * top_k + local_experts * (pad - 1)


def problems_for_model(model: ModelShape, dtype: str) -> list[MoEProblem]:
    if not (model.num_experts and model.experts_per_token):
        raise NotApplicableError(f"model {model.name} has no routed experts, so the MoE "
                                 "kernels do not apply to it")
    if dtype not in MOE_DTYPES:
        raise NotApplicableError(f"the MoE kernels move {' or '.join(MOE_DTYPES)} hidden "
                                 f"states, not {dtype}")
    return [MoEProblem(num_tokens=1, dtype=dtype, hidden=model.hidden_size,
                       experts=model.num_experts, top_k=model.experts_per_token,
                       pad=DEFAULT_PAD, expert_begin=0, expert_end=model.num_experts)]


# ---------------------------------------------------------------------------------------------
# Routing inputs


def make_routing(problem: MoEProblem, device, generator: torch.Generator,
                 skewed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """topk_ids (T, K) int32, K distinct experts per token, and topk_weights (T, K) fp32 that
    sum to 1 per token. Skewed routing sends most pairs to a few hot experts and leaves the
    upper half of the experts empty."""
    scores = torch.rand(problem.num_tokens, problem.experts, generator=generator, device=device)
    if skewed:
        scores[:, problem.experts // 2:] = -1.0  # never chosen while K <= E / 2
        scores[:, :SKEWED_HOT_EXPERTS] += 1.0
    weights, ids = scores.topk(problem.top_k, dim=1)
    weights = torch.softmax(weights, dim=1)
    return ids.to(torch.int32), weights.float()


# ---------------------------------------------------------------------------------------------
# Reference


# The references run inside CUDA graphs too (`cutetune bench` times them as the torch peer), so
# they avoid everything that waits for the host: no boolean-mask indexing, no bincount.


def reference_layout(topk_ids: torch.Tensor, problem: MoEProblem) -> dict[str, torch.Tensor]:
    """counts, offsets, row_of and error for the routing: the torch way, a stable sort of the
    pairs by expert (each expert's pairs in token order)."""
    ids = topk_ids.long().flatten()
    valid = (ids >= 0) & (ids < problem.experts)
    local = valid & (ids >= problem.expert_begin) & (ids < problem.expert_end)
    # Pairs that are not local sort last, under the extra expert L.
    local_ids = torch.where(local, ids - problem.expert_begin, problem.local_experts)
    counts = torch.zeros(problem.local_experts + 1, dtype=torch.long, device=ids.device)
    counts.scatter_add_(0, local_ids, torch.ones_like(local_ids))
    counts = counts[:-1]
    padded = (counts + problem.pad - 1) // problem.pad * problem.pad
    offsets = torch.zeros(problem.local_experts + 1, dtype=torch.long, device=ids.device)
    offsets[1:] = torch.cumsum(padded, 0)
    order = torch.argsort(local_ids, stable=True)
    sorted_ids = local_ids[order]
    clamped = sorted_ids.clamp(max=problem.local_experts - 1)
    first_of_expert = torch.cumsum(counts, 0) - counts
    slot = torch.arange(ids.numel(), device=ids.device) - first_of_expert[clamped]
    row_in_order = torch.where(sorted_ids < problem.local_experts, offsets[clamped] + slot, -1)
    rows = torch.empty_like(ids).scatter_(0, order, row_in_order)
    return {"counts": counts.int(), "offsets": offsets.int(),
            "row_of": rows.view_as(topk_ids).int(),
            "error": (~valid).any().int().view(1)}


def reference_dispatch(x: torch.Tensor, topk_ids: torch.Tensor,
                       problem: MoEProblem) -> dict[str, torch.Tensor]:
    layout = reference_layout(topk_ids, problem)
    rows = layout["row_of"].flatten().long()
    tokens = torch.arange(rows.numel(), device=x.device) // problem.top_k
    # Pairs without a row land in one extra row past the capacity, dropped at the end.
    spill = problem.capacity
    dispatched = torch.zeros(spill + 1, x.shape[1], dtype=x.dtype, device=x.device)
    dispatched.index_copy_(0, torch.where(rows >= 0, rows, spill), x.index_select(0, tokens))
    return {**layout, "dispatched": dispatched[:spill]}


def reference_combine(expert_out: torch.Tensor, row_of: torch.Tensor,
                      topk_weights: torch.Tensor) -> torch.Tensor:
    """fp32 sum over k of weight * the pair's expert row (rows of -1, or past the capacity,
    add nothing, as in the kernel)."""
    rows = row_of.long()
    capacity = expert_out.shape[0]
    gathered = expert_out.index_select(0, rows.clamp(0, max(capacity - 1, 0)).flatten()).view(
        *rows.shape, expert_out.shape[1])
    weighted = gathered.float() * topk_weights.float()[..., None]
    return torch.where(((rows >= 0) & (rows < capacity))[..., None], weighted, 0.0).sum(1)


def check_dispatch(outputs, expected, problem: MoEProblem) -> None:
    """Counts, offsets and the error flag exactly; every local pair in its expert's segment,
    in a row of its own, holding its token bit for bit; padding rows zero if the problem asks
    for zero_padding; other pairs -1.
    `expected` is reference_dispatch's output (whose row order is one of the valid ones)."""
    for name in ("counts", "offsets", "error"):
        if not torch.equal(outputs[name].int(), expected[name]):
            raise VerificationError(f"{name}: got {outputs[name].tolist()}, expected "
                                    f"{expected[name].tolist()}")
    want, got = expected["row_of"].flatten().long(), outputs["row_of"].flatten().long()
    if not torch.equal(got < 0, want < 0):
        bad = int(((got < 0) != (want < 0)).nonzero()[0])
        raise VerificationError(f"row_of: pair {bad} (token {bad // problem.top_k}) got row "
                                f"{int(got[bad])}, expected {'-1' if want[bad] < 0 else 'a row'}")
    kept = want >= 0
    offsets = expected["offsets"].long()
    # The segment of a pair's expert: the reference's row lies in the same segment.
    segment = torch.searchsorted(offsets, want[kept], right=True) - 1
    start = offsets[segment]
    end = start + expected["counts"].long()[segment]
    rows = got[kept]
    if not bool(((rows >= start) & (rows < end)).all()):
        raise VerificationError("row_of: some pair's row lies outside its expert's segment")
    if rows.unique().numel() != rows.numel():
        raise VerificationError("row_of: two pairs share a row")
    filled, dispatched = expected["dispatched"], outputs["dispatched"]
    used = int(offsets[-1])
    token_rows = torch.zeros(used, dtype=torch.bool, device=rows.device)
    token_rows[rows] = True
    # Rows the reference filled with a token, by the same pair, must match bit for bit.
    if not torch.equal(dispatched[rows], filled[want[kept]]):
        raise VerificationError("dispatched: some row does not hold its pair's token")
    if not problem.zero_padding:
        return
    padding = dispatched[:used][~token_rows]
    if padding.numel() and not bool((padding == 0).all()):
        raise VerificationError("dispatched: padding rows are not zero")
