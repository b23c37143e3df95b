"""The token embedding lookup fused with the first decoder layer's input RMSNorm, in one launch.

    residual[t] = weight[ids[t]] * EMBED_SCALE      (rounded to the table's dtype)
    out[t]      = (norm_weight + WEIGHT_BIAS) * residual[t] * rsqrt(mean(residual[t]^2) + EPS)

ids is (tokens,) int32 or int64, weight the (rows, hidden) table, norm_weight (hidden,) in its
dtype; residual and out are (tokens, hidden) in that dtype too. `residual` is the residual
stream the first layer adds its attention output to (the embedding itself), `out` the input its
attention reads. EMBED_SCALE is 1 for models that feed the rows as they are (Llama, Qwen3,
Mixtral, DeepSeek-V3) and Gemma's normaliser, sqrt(hidden_size) rounded to the model's dtype,
for Gemma's (its ScaledWordEmbedding multiplies the rows in their dtype, so the residual holds
the rounded product, and the norm reads that).

The whole vocabulary on one rank: a vocab-parallel rank holds zero rows for the other ranks'
ids, and a norm of a partial row is wrong until the ranks' rows are summed (an all-reduce
between the lookup and the norm), so the problem has no rank range: the table holds ids
[0, vocab_size). Such a rank runs `embedding`, the all-reduce, then `rmsnorm`. Bad ids are
embedding's: an id outside [0, vocab_size), or past the table's rows where it has fewer, gets
zero rows (its out is zero too) and raises `error` (1,) int32 on the device, which the kernel
never clears. The table may have more rows than the vocabulary (an engine's padding): those are
never read.

Work split, forms and knobs are rmsnorm's plain form (its docstring): one block of WARPS warps
per token (block_per_row) or one warp per token, WARPS tokens per block (warp_per_row); each of
a row's threads gathers vectors lane, lane + THREADS, ... of the token's table row. The space
holds rmsnorm's constraints, judged on the point seen as rmsnorm's; the cache hints are plain
or streaming accesses to the table, residual and out (the norm's weight keeps plain loads).
The id lookup and the gather are embedding's device helpers, the reduction rmsnorm's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from cutetune.kernels import cache_hints, embedding, rmsnorm
from cutetune.kernels.cost import Cost
from cutetune.kernels.dtypes import DTYPE_BYTES, FLOAT_TOLERANCE, TORCH_DTYPES
from cutetune.kernels.registry import (
    ChainStep,
    DeviceCompile,
    KernelDef,
    NotApplicableError,
    Tensors,
    register,
)
from cutetune.spaces.models import ModelShape
from cutetune.spaces.problem import Problem
from cutetune.spaces.space import Constraint, Space


def rounded_scale(scale: float, dtype: str) -> float:
    """`scale` as Gemma applies it to rows of `dtype`: a float32 tensor cast to that dtype
    (transformers' embed_scale buffer, `.to(weight.dtype)`)."""
    return float(torch.tensor(scale, dtype=torch.float32).to(TORCH_DTYPES[dtype]))


@dataclass(frozen=True, kw_only=True)
class EmbeddingRMSNormProblem(Problem):
    dtype: str
    hidden: int
    # The whole vocabulary, all of it this rank's (the module docstring says why).
    vocab_size: int
    ids_dtype: str
    eps: float
    weight_bias: float
    # What each row is multiplied by before the norm, a value of dtype (rounded_scale).
    embed_scale: float

    def __post_init__(self) -> None:
        super().__post_init__()
        # embedding's checks of dtype, hidden, the vocabulary and the ids; rmsnorm's of hidden,
        # eps and weight_bias.
        _ = self.embedding, self.norm
        if (isinstance(self.embed_scale, bool) or not isinstance(self.embed_scale, float | int)
                or not self.embed_scale > 0
                or rounded_scale(self.embed_scale, self.dtype) != self.embed_scale):
            raise ValueError(f"embed_scale must be a positive value of {self.dtype}, got "
                             f"{self.embed_scale!r}: round it with rounded_scale")

    @property
    def embedding(self) -> embedding.EmbeddingProblem:
        """The lookup's part, as embedding states it: one rank holds the whole vocabulary."""
        return embedding.EmbeddingProblem(
            num_tokens=self.num_tokens, dtype=self.dtype, hidden=self.hidden,
            vocab_size=self.vocab_size, vocab_start=0, vocab_end=self.vocab_size,
            ids_dtype=self.ids_dtype)

    @property
    def norm(self) -> rmsnorm.RMSNormProblem:
        """The norm's part, as rmsnorm states it: its plain form, out in the table's dtype."""
        return rmsnorm.RMSNormProblem(
            num_tokens=self.num_tokens, dtype=self.dtype, out_dtype=self.dtype,
            hidden=self.hidden, eps=self.eps, weight_bias=self.weight_bias, fused_add=False)


@dataclass(frozen=True)
class EmbeddingRMSNormConfig:
    form: str
    vector_bits: int
    warps_per_block: int
    cache_hints: str


def _norm_config(config: EmbeddingRMSNormConfig) -> rmsnorm.RMSNormConfig:
    """The point as rmsnorm's: the same split of a row over its threads."""
    return rmsnorm.RMSNormConfig(config.form, config.vector_bits, config.warps_per_block,
                                 config.cache_hints)


def _borrowed(constraint: Constraint) -> Constraint:
    """rmsnorm's constraint, held by this point seen as rmsnorm's problem and config."""
    return Constraint(constraint.name, constraint.reason,
                      lambda p, c, d: constraint.holds(p.norm, _norm_config(c), d))


SPACE = Space(
    config_type=EmbeddingRMSNormConfig,
    params=(
        *(param for param in rmsnorm.SPACE.params if param.name != "cache_hints"),
        cache_hints.CACHE_HINTS_PARAM,
    ),
    # Every one of rmsnorm's but the evict_last hint's, which this space does not offer.
    constraints=tuple(_borrowed(c) for c in rmsnorm.SPACE.constraints
                      if c.name != "evict_last_loads_whole_words"),
)


def _bytes_moved(problem: EmbeddingRMSNormProblem) -> int:
    # The ids, a table row read per token, residual and out written, the weight once. The
    # roofline assumes every id distinct (a row each), the most a call can move.
    row_bytes = problem.num_tokens * problem.hidden * DTYPE_BYTES[problem.dtype]
    return (problem.num_tokens * embedding.ID_BYTES[problem.ids_dtype] + 3 * row_bytes
            + problem.hidden * DTYPE_BYTES[problem.dtype])


def default_config(problem: EmbeddingRMSNormProblem, device) -> EmbeddingRMSNormConfig:
    """The seed heuristic: rmsnorm's default split of the row (form, vector, warps) for its
    plain form of this width, which this space holds too; streaming accesses for calls that
    move at most rmsnorm's STREAMING_MAX_L2_MULTIPLE times the L2, else plain ones.
    EmptySpaceError, naming the constraints, where no point serves the problem."""
    norm = rmsnorm.default_config(problem.norm, device)
    hints = (cache_hints.STREAMING
             if _bytes_moved(problem) <= rmsnorm.STREAMING_MAX_L2_MULTIPLE * device.l2_bytes
             else cache_hints.NORMAL)
    return EmbeddingRMSNormConfig(norm.form, norm.vector_bits, norm.warps_per_block, hints)


def cost(problem: EmbeddingRMSNormProblem, config: EmbeddingRMSNormConfig, device) -> Cost:
    """rmsnorm's plain form's blocks and threads, with this kernel's bytes and flops (the
    scale's multiply, where there is one)."""
    scaled = problem.embed_scale != 1.0
    return dataclasses.replace(
        rmsnorm.cost(problem.norm, _norm_config(config), device),
        bytes_moved=_bytes_moved(problem),
        flops=(5 if scaled else 4) * problem.num_tokens * problem.hidden)


# ---------------------------------------------------------------------------------------------
# The launch (the kernel, its launcher and its compile are device/embedding_rmsnorm.py)


def launch(compiled, tensors: Tensors) -> None:
    compiled(tensors["ids"], tensors["weight"], tensors["norm_weight"],
             tensors["residual"], tensors["out"], tensors["error"])


# ---------------------------------------------------------------------------------------------
# Reference, inputs, model problems, the unfused chain


def reference(tensors: Tensors, problem: EmbeddingRMSNormProblem) -> dict[str, torch.Tensor]:
    """embedding's reference (rows and flag), the rows scaled in the table's dtype, then
    rmsnorm's reference of those rows."""
    looked_up = embedding.reference(tensors, problem.embedding)
    rows = looked_up["out"]
    if problem.embed_scale != 1.0:
        rows = (rows * problem.embed_scale).to(TORCH_DTYPES[problem.dtype]).float()
    normed = rmsnorm.reference({"x": rows, "residual": rows, "weight": tensors["norm_weight"]},
                               problem.norm)
    return {"residual": rows, "out": normed["out"], "error": looked_up["error"]}


def make_inputs(problem: EmbeddingRMSNormProblem, device, generator: torch.Generator) -> Tensors:
    """embedding's inputs (its ids, bad ones included from its BAD_IDS_FROM_TOKENS tokens, and
    its table of a few rows per token), the norm's weight as rmsnorm draws it, residual and
    out allocated (the verifier poisons them), the flag zeroed."""
    looked_up = embedding.make_inputs(problem.embedding, device, generator)
    shape = (problem.num_tokens, problem.hidden)
    dtype = TORCH_DTYPES[problem.dtype]
    weight = 1.0 + 0.5 * torch.randn(problem.hidden, generator=generator, device=device,
                                     dtype=torch.float32)
    return {
        "ids": looked_up["ids"],
        "weight": looked_up["weight"],
        "norm_weight": weight.to(dtype),
        "residual": looked_up["out"],
        "out": torch.empty(shape, dtype=dtype, device=device),
        "error": looked_up["error"],
    }


def problems_for_model(model: ModelShape, dtype: str) -> list[EmbeddingRMSNormProblem]:
    """The model's table on one GPU and its first layer's input norm, int64 ids as engines
    hold them; Gemma's normaliser as the scale."""
    if model.vocab_size is None:
        raise NotApplicableError(f"model {model.name}'s config states no vocab_size")
    return [EmbeddingRMSNormProblem(
        num_tokens=1, dtype=dtype, hidden=model.hidden_size, vocab_size=model.vocab_size,
        ids_dtype="int64", eps=model.rms_norm_eps, weight_bias=model.norm_weight_bias,
        embed_scale=rounded_scale(model.embedding_scale, dtype))]


def _unscaled_embedding(problem: EmbeddingRMSNormProblem) -> embedding.EmbeddingProblem:
    if problem.embed_scale != 1.0:
        raise NotApplicableError(f"no chain of our kernels scales the rows by "
                                 f"{problem.embed_scale:g} between the lookup and the norm")
    return problem.embedding


KERNEL = register(KernelDef(
    name="embedding_rmsnorm",
    description="token embedding lookup (the whole vocabulary on one rank, optionally scaled) "
                "fused with the first layer's input RMSNorm: the residual stream and the "
                "normed rows, bad ids flagged on the device",
    problem_type=EmbeddingRMSNormProblem,
    space=SPACE,
    problems_for_model=problems_for_model,
    default_config=default_config,
    cost=cost,
    compile_function=DeviceCompile("cutetune.kernels.device.embedding_rmsnorm"),
    launch=launch,
    make_inputs=make_inputs,
    reference=reference,
    outputs=("residual", "out", "error"),
    written_in_place=("error",),
    # The residual is a copy (a product rounded once, with a scale), out a norm's rounding;
    # the flag is compared exactly (device/verify.py: integer outputs).
    tolerance=FLOAT_TOLERANCE,
    source_file=__file__,
    unfused=(ChainStep("embedding", _unscaled_embedding, names={"out": "residual"}),
             ChainStep("rmsnorm", lambda problem: problem.norm,
                       names={"x": "residual", "weight": "norm_weight"})),
))
