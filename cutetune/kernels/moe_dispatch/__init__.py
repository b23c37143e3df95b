"""MoE dispatch (TP=1): route every (token, k) pair to its expert's segment and copy the tokens.

For the local experts [expert_begin, expert_end) (L of them) it writes moe_common's layout:
per-expert `counts`, padded `offsets`, the row of every pair in `row_of` (-1: not local, or an
expert id outside [0, E), which also raises `error`), and `dispatched`, the hidden states of
each expert's pairs in a segment padded to a multiple of `pad` (the padding rows zeroed when
the problem asks for zero_padding).

Five forms (FlashInfer would call them runners), each a module here with its own Config, knobs,
constraints and kernels, and each one compiled callable on one stream:

- fused (decode): one cooperative kernel; block 0 routes, a grid barrier, all blocks copy.
- replicated (decode): one ordinary kernel; every block routes every pair, no barrier.
- split (prefill): a cooperative routing kernel, then a vector copy kernel launched early
  behind it (programmatic dependent launch).
- split_bulk (prefill): split's routing, then a copy of whole rows by the bulk-copy engine.
- split_block_ranks (prefill, few experts): a routing kernel with no grid barrier that ranks
  pairs within its blocks, then a copy kernel that turns those ranks into rows.

common.py holds what the forms share on the host (limits, workspace layout, resource
arithmetic), device.py their shared device code, space.py the space of all five, the default
and the cost, launcher.py the launch path (its cooperative-grid check), compile.py the launcher
and the compile, and each form's *_kernels.py its kernels. The vector width of the copy is not a
knob: the problem forces it (common.vector_bits).

The copy reads each token once and writes it to each of its K rows (a thread loads one vector
of `tokens_per_block` tokens, then stores each to the rows row_of names), so x is read once
per token, not once per pair. A work unit is (a group of tokens_per_block tokens, a slice of
one vector per thread across the row); padding units are (a padded segment, a slice).

Scratch lives in a persistent int32 workspace (make_inputs and the public op provide it; it is
zeroed once when allocated, never per call):
- the grid-barrier word (see `grid_barrier`: it returns to its starting state after every
  barrier, whatever the grid size, so nothing resets it between calls or between configs);
- an epoch and two sets of global per-expert counters (plus an error count), for split's
  atomic exchange. Such a call uses the set of its epoch's parity, which the previous such call
  zeroed, and zeroes the other set for the next; block 0 advances the epoch after the barrier,
  when every block has read it. Calls that publish their counts leave both alone.
- the fused kernel's list of padded segments (block 0 writes it before the barrier).
- the table of published counts (PUBLISHED_COUNT_WORDS words), rewritten whole by every call
  that publishes, and by every split_block_ranks call.
Concurrent calls must not share a workspace (the public op keeps one per device and stream).
"""

from __future__ import annotations

import torch

from cutetune.kernels.dtypes import FLOAT_TOLERANCE, TORCH_DTYPES
from cutetune.kernels.moe_common import (
    MoEProblem,
    check_dispatch,
    make_routing,
    problems_for_model,
    reference_dispatch,
)
from cutetune.kernels.moe_dispatch.common import workspace_words
from cutetune.kernels.moe_dispatch.launcher import CompiledDispatch, launch
from cutetune.kernels.moe_dispatch.space import SPACE, cost, default_config
from cutetune.kernels.registry import DeviceCompile, KernelDef, Tensors, register


def new_workspace(problem: MoEProblem, device) -> torch.Tensor:
    """Zeroed once here; the kernels keep it consistent from call to call."""
    return torch.zeros(workspace_words(problem.local_experts), dtype=torch.int32, device=device)


def make_inputs(problem: MoEProblem, device, generator: torch.Generator) -> Tensors:
    """x random, uniform routing, the outputs allocated (the verifier poisons them) and a
    workspace."""
    dtype = TORCH_DTYPES[problem.dtype]
    x = torch.randn(problem.num_tokens, problem.hidden, generator=generator, device=device,
                    dtype=torch.float32).to(dtype)
    topk_ids, _ = make_routing(problem, device, generator)
    L = problem.local_experts
    return {
        "x": x,
        "topk_ids": topk_ids,
        "counts": torch.empty(L, dtype=torch.int32, device=device),
        "offsets": torch.empty(L + 1, dtype=torch.int32, device=device),
        "row_of": torch.empty(problem.num_tokens, problem.top_k, dtype=torch.int32,
                              device=device),
        "dispatched": torch.empty(problem.capacity, problem.hidden, dtype=dtype, device=device),
        "error": torch.empty(1, dtype=torch.int32, device=device),
        "workspace": new_workspace(problem, device),
    }


def reference(tensors: Tensors, problem: MoEProblem) -> dict[str, torch.Tensor]:
    """moe_common's torch reference: a stable sort of the pairs by expert, index_copy."""
    return reference_dispatch(tensors["x"], tensors["topk_ids"], problem)


KERNEL = register(KernelDef(
    name="moe_dispatch",
    description="MoE dispatch (TP=1): route (token, k) pairs to padded per-expert segments "
                "and copy the tokens there",
    problem_type=MoEProblem,
    space=SPACE,
    problems_for_model=problems_for_model,
    default_config=default_config,
    cost=cost,
    compile_function=DeviceCompile("cutetune.kernels.moe_dispatch.compile"),
    launch=launch,
    make_inputs=make_inputs,
    reference=reference,
    outputs=("counts", "offsets", "row_of", "dispatched", "error"),
    written_in_place=(),
    tolerance=FLOAT_TOLERANCE,
    source_file=__file__,
    check=check_dispatch,
    bind=CompiledDispatch,
))
