"""embedding_rmsnorm's Problem, Config space, seed heuristic, cost, reference, inputs, model
problems and unfused chain (no compiling)."""

import pytest
import torch

from cutetune.bench import UNFUSED_NAME, candidates
from cutetune.build.compiled import CompiledPoints
from cutetune.device.specs import DEVICE_SPECS
from cutetune.device.verify import check_outputs
from cutetune.kernels import embedding, rmsnorm
from cutetune.kernels.cache_hints import NORMAL, STREAMING
from cutetune.kernels.dtypes import TORCH_DTYPES
from cutetune.kernels.embedding_rmsnorm import (
    KERNEL,
    SPACE,
    EmbeddingRMSNormConfig,
    EmbeddingRMSNormProblem,
    cost,
    default_config,
    make_inputs,
    problems_for_model,
    reference,
    rounded_scale,
)
from cutetune.kernels.registry import NotApplicableError, VerificationError, get_kernel
from cutetune.kernels.rmsnorm import BLOCK_PER_ROW, WARP_PER_ROW
from cutetune.serving.plan import ServingPlan
from cutetune.spaces.models import PRESETS, ModelShape, load_model
from testkit.reference_runner import reference_runner

H200 = DEVICE_SPECS["H200"]
DTYPES = ("bfloat16", "float16", "float32")
HF_CONFIGS = "tests/data/hf_configs"
# Gemma 3 1B: hidden 1152, whose sqrt (33.941...) each dtype rounds its own way.
GEMMA_HIDDEN = 1152


def problem(**overrides) -> EmbeddingRMSNormProblem:
    values = dict(num_tokens=1, dtype="bfloat16", hidden=4096, vocab_size=151936,
                  ids_dtype="int64", eps=1e-6, weight_bias=0.0, embed_scale=1.0)
    values.update(overrides)
    return EmbeddingRMSNormProblem(**values)


def gemma(dtype: str = "bfloat16", **overrides) -> EmbeddingRMSNormProblem:
    values = dict(dtype=dtype, hidden=GEMMA_HIDDEN, vocab_size=262144, eps=1e-6,
                  weight_bias=1.0, embed_scale=rounded_scale(GEMMA_HIDDEN**0.5, dtype))
    values.update(overrides)
    return problem(**values)


def test_registered_under_its_name():
    assert get_kernel("embedding_rmsnorm") is KERNEL
    assert KERNEL.space is SPACE and KERNEL.problem_type is EmbeddingRMSNormProblem
    assert KERNEL.outputs == ("residual", "out", "error")
    assert KERNEL.written_in_place == ("error",)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("dtype", "int8", "dtype 'int8' not supported"),
    ("hidden", 32, "hidden 32 not supported: use 64 to 16384"),
    ("vocab_size", 0, "vocab_size must be a positive integer"),
    ("vocab_size", 2**31, "vocab_size 2147483648 must be below 2"),
    ("ids_dtype", "int16", "ids_dtype 'int16' not supported"),
    ("eps", 0.0, "eps must be positive"),
    ("weight_bias", 0.5, "weight_bias must be 0 or 1"),
    ("embed_scale", 0.0, "embed_scale must be a positive value of bfloat16"),
    ("embed_scale", 4096**0.5 + 0.01, "embed_scale must be a positive value of bfloat16"),
    ("embed_scale", True, "embed_scale must be a positive value"),
    ("num_tokens", 0, "num_tokens must be a positive integer"),
])
def test_problem_validation(field, value, message):
    with pytest.raises(ValueError, match=message):
        problem(**{field: value})


@pytest.mark.parametrize(("dtype", "scale"), [("bfloat16", 34.0), ("float16", 33.9375),
                                              ("float32", 33.941123962402344)])
def test_gemma_scale_is_sqrt_hidden_rounded_to_the_dtype(dtype, scale):
    """As transformers' Gemma3TextScaledWordEmbedding: a float32 buffer cast to the rows'
    dtype."""
    assert rounded_scale(GEMMA_HIDDEN**0.5, dtype) == scale
    expected = float(torch.tensor(GEMMA_HIDDEN**0.5).to(TORCH_DTYPES[dtype]))
    assert gemma(dtype).embed_scale == expected == scale


def test_the_parts_are_embedding_s_whole_table_and_rmsnorm_s_plain_form():
    p = gemma(num_tokens=7, ids_dtype="int32")
    assert p.embedding == embedding.EmbeddingProblem(
        num_tokens=7, dtype="bfloat16", hidden=GEMMA_HIDDEN, vocab_size=262144, vocab_start=0,
        vocab_end=262144, ids_dtype="int32")
    assert p.norm == rmsnorm.RMSNormProblem(
        num_tokens=7, dtype="bfloat16", out_dtype="bfloat16", hidden=GEMMA_HIDDEN, eps=1e-6,
        weight_bias=1.0, fused_add=False)


def test_problem_key_is_static_part_only():
    assert problem(num_tokens=1).static_key() == problem(num_tokens=512).static_key()
    assert problem().static_key() != problem(embed_scale=64.0).static_key()


# ---------------------------------------------------------------------------------------------
# Model problems


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_normalises_its_whole_table_unscaled(name):
    model = PRESETS[name]
    (p,) = problems_for_model(model, "bfloat16")
    assert (p.hidden, p.vocab_size, p.eps, p.weight_bias, p.embed_scale, p.ids_dtype) == (
        model.hidden_size, model.vocab_size, model.rms_norm_eps, model.norm_weight_bias, 1.0,
        "int64")


def test_llama_takes_its_eps():
    (p,) = problems_for_model(PRESETS["llama-3.1-8b"], "float16")
    assert (p.eps, p.dtype, p.vocab_size) == (1e-5, "float16", 128256)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemma_3_scales_by_its_normaliser_in_the_dtype(dtype):
    model = load_model(f"{HF_CONFIGS}/gemma-3-1b-it.json")
    (p,) = problems_for_model(model, dtype)
    assert p.hidden == GEMMA_HIDDEN and p.weight_bias == 1.0
    assert p.embed_scale == rounded_scale(GEMMA_HIDDEN**0.5, dtype)


def test_not_applicable_without_a_vocabulary():
    model = ModelShape(name="m", hidden_size=4096, num_q_heads=32, num_kv_heads=8, head_dim=128,
                       rms_norm_eps=1e-6, qk_norm=False)
    with pytest.raises(NotApplicableError, match="states no vocab_size"):
        problems_for_model(model, "bfloat16")


# ---------------------------------------------------------------------------------------------
# Space, heuristic, cost


def rejected_by(p: EmbeddingRMSNormProblem) -> dict:
    return {r.config: r.constraint for r in SPACE.enumerate(p, H200).rejected}


def test_the_space_is_rmsnorm_s_knobs_with_plain_or_streaming_hints():
    assert [param.name for param in SPACE.params] == [
        "form", "vector_bits", "warps_per_block", "cache_hints"]
    assert dict((param.name, param.choices) for param in SPACE.params)["cache_hints"] == (
        NORMAL, STREAMING)
    names = [c.name for c in SPACE.constraints]
    assert names == [c.name for c in rmsnorm.SPACE.constraints
                     if c.name != "evict_last_loads_whole_words"]


def test_rmsnorm_s_constraints_refuse_with_their_reasons():
    # bf16 4096: 512 vectors of 128 bits, so 32 warps would leave half the threads idle; one
    # warp would hold 128 elements a thread; a warp per row cannot hold the row.
    rejected = rejected_by(problem())
    assert rejected[EmbeddingRMSNormConfig(BLOCK_PER_ROW, 128, 32, NORMAL)] == "no_idle_threads"
    assert rejected[EmbeddingRMSNormConfig(BLOCK_PER_ROW, 128, 1, NORMAL)] == (
        "row_fits_registers")
    assert rejected[EmbeddingRMSNormConfig(WARP_PER_ROW, 128, 4, NORMAL)] == "row_fits_one_warp"
    # hidden 1004 in bf16: no whole number of 128-bit vectors (8 elements), 251 of 64 bits.
    odd = rejected_by(problem(hidden=1004))
    assert odd[EmbeddingRMSNormConfig(BLOCK_PER_ROW, 128, 1, NORMAL)] == (
        "hidden_splits_into_vectors")
    assert EmbeddingRMSNormConfig(BLOCK_PER_ROW, 64, 4, NORMAL) in SPACE.enumerate(
        problem(hidden=1004), H200).valid
    reasons = {c.name: c.reason for c in SPACE.constraints}
    assert reasons["no_idle_threads"].startswith("every thread of a row must own")


@pytest.mark.parametrize("p", [problem(), gemma(), gemma("float32"), problem(hidden=1024),
                               problem(dtype="float32", hidden=2880)], ids=str)
def test_valid_points_are_rmsnorm_s_plain_points_of_the_width(p):
    """The same split of the row as rmsnorm's plain form, hint for hint."""
    ours = {(c.form, c.vector_bits, c.warps_per_block, c.cache_hints)
            for c in SPACE.enumerate(p, H200).valid}
    theirs = {(c.form, c.vector_bits, c.warps_per_block, c.cache_hints)
              for c in rmsnorm.SPACE.enumerate(p.norm, H200).valid
              if c.cache_hints in (NORMAL, STREAMING)}
    assert ours == theirs and ours


@pytest.mark.parametrize("tokens", [1, 64, 4096, 65536])
@pytest.mark.parametrize("p", [problem(), gemma("float16"), problem(hidden=1024)], ids=str)
def test_default_config_is_rmsnorm_s_split_and_a_valid_point(p, tokens):
    p = p.with_tokens(tokens)
    config = default_config(p, H200)
    SPACE.check(p, config, H200)
    norm = rmsnorm.default_config(p.norm, H200)
    assert (config.form, config.vector_bits, config.warps_per_block) == (
        norm.form, norm.vector_bits, norm.warps_per_block)


def test_default_streams_calls_within_twice_the_l2():
    assert default_config(problem(num_tokens=1), H200).cache_hints == STREAMING
    # 65536 tokens of 8 KiB rows, three of them: far past the L2.
    assert default_config(problem(num_tokens=65536), H200).cache_hints == NORMAL


def test_default_of_a_decode_row_that_fits_a_warp():
    assert default_config(problem(hidden=1024), H200) == EmbeddingRMSNormConfig(
        WARP_PER_ROW, 128, 1, STREAMING)


def test_cost_by_hand():
    p = problem(num_tokens=100)
    config = EmbeddingRMSNormConfig(BLOCK_PER_ROW, 128, 4, NORMAL)
    c = cost(p, config, H200)
    # int64 ids, a row read, residual and out written, the weight once.
    assert c.bytes_moved == 100 * 8 + 3 * 100 * 4096 * 2 + 4096 * 2
    assert c.flops == 4 * 100 * 4096
    assert (c.blocks, c.threads_per_block, c.smem_per_block) == (100, 128, 16)
    scaled = cost(gemma(num_tokens=100, ids_dtype="int32"),
                  EmbeddingRMSNormConfig(WARP_PER_ROW, 64, 8, STREAMING), H200)
    assert scaled.bytes_moved == 100 * 4 + 3 * 100 * GEMMA_HIDDEN * 2 + GEMMA_HIDDEN * 2
    assert scaled.flops == 5 * 100 * GEMMA_HIDDEN
    assert (scaled.blocks, scaled.threads_per_block) == (13, 256)


# ---------------------------------------------------------------------------------------------
# Reference and inputs


def test_reference_is_embedding_s_then_rmsnorm_s():
    p = problem(num_tokens=9, hidden=256, vocab_size=1000, weight_bias=1.0)
    t = make_inputs(p, "cpu", torch.Generator().manual_seed(3))
    looked_up = embedding.reference(t, p.embedding)
    normed = rmsnorm.reference({"x": looked_up["out"], "residual": looked_up["out"],
                                "weight": t["norm_weight"]}, p.norm)
    ours = reference(t, p)
    assert torch.equal(ours["residual"], looked_up["out"])
    assert torch.equal(ours["out"], normed["out"])
    assert torch.equal(ours["error"], looked_up["error"]) and int(ours["error"]) == 1


def test_reference_matches_gemma_s_scaled_embedding_and_norm():
    """Gemma: the rows times the normaliser in bf16, then the (1 + w) norm of that."""
    p = gemma(num_tokens=5, vocab_size=64)
    t = make_inputs(p, "cpu", torch.Generator().manual_seed(4))
    # Five tokens: one id is -1, one past the vocabulary; all within the table here.
    ids = t["ids"].clamp(0, t["weight"].shape[0] - 1)
    t["ids"] = ids
    rows = torch.nn.functional.embedding(ids, t["weight"])
    scaled = rows * torch.tensor(GEMMA_HIDDEN**0.5).to(torch.bfloat16)
    x = scaled.float()
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (
        1.0 + t["norm_weight"].float())
    ours = reference(t, p)
    assert torch.equal(ours["residual"], scaled.float())
    torch.testing.assert_close(ours["out"], normed, rtol=1e-6, atol=1e-6)
    assert int(ours["error"]) == 0


def test_a_bad_id_gets_zero_rows_in_both_outputs():
    p = problem(num_tokens=4, hidden=128, vocab_size=50)
    t = make_inputs(p, "cpu", torch.Generator().manual_seed(5))
    t["ids"] = torch.tensor([3, -1, 50, 2**32], dtype=torch.int64)
    ours = reference(t, p)
    assert torch.equal(ours["residual"][1:], torch.zeros(3, 128))
    assert torch.equal(ours["out"][1:], torch.zeros(3, 128))
    assert int(ours["error"]) == 1 and torch.count_nonzero(ours["out"][0]) > 0


@pytest.mark.parametrize("tokens", [1, 3, 4, 17])
def test_inputs(tokens):
    p = gemma("float16", num_tokens=tokens, ids_dtype="int32")
    t = make_inputs(p, "cpu", torch.Generator().manual_seed(6))
    assert set(t) == {"ids", "weight", "norm_weight", "residual", "out", "error"}
    assert t["ids"].dtype is torch.int32 and t["ids"].shape == (tokens,)
    assert t["weight"].shape == (min(p.vocab_size, 4 * tokens), GEMMA_HIDDEN)
    assert t["norm_weight"].shape == (GEMMA_HIDDEN,) and t["norm_weight"].dtype is torch.float16
    for name in ("residual", "out"):
        assert t[name].shape == (tokens, GEMMA_HIDDEN) and t[name].dtype is torch.float16
    assert torch.equal(t["error"], torch.zeros(1, dtype=torch.int32))
    bad = (t["ids"] < 0) | (t["ids"] >= p.vocab_size)
    assert int(bad.sum()) == (2 if tokens >= embedding.BAD_IDS_FROM_TOKENS else 0)


def test_the_flag_is_verified_exactly():
    p = problem(num_tokens=8, hidden=256, vocab_size=1000)
    t = make_inputs(p, "cpu", torch.Generator().manual_seed(7))
    expected = reference(t, p)
    outputs = {"residual": expected["residual"].bfloat16(), "out": expected["out"].bfloat16(),
               "error": expected["error"].clone()}
    check_outputs(KERNEL, p, outputs, expected)
    outputs["error"].zero_()
    with pytest.raises(VerificationError, match="error: 1 of 1 elements off"):
        check_outputs(KERNEL, p, outputs, expected)


# ---------------------------------------------------------------------------------------------
# The unfused chain `cutetune bench` times beside it


def test_the_unfused_chain_is_embedding_then_rmsnorm():
    p = problem(num_tokens=5)
    assert [(step.kernel, step.problem(p), dict(step.names)) for step in KERNEL.unfused] == [
        ("embedding", p.embedding, {"out": "residual"}),
        ("rmsnorm", p.norm, {"x": "residual", "weight": "norm_weight"})]


def test_bench_runs_the_chain_on_the_tensors_the_lookup_wrote(monkeypatch):
    """Each step stands in as its kernel's reference: the chain must give the fused
    reference, rmsnorm reading the lookup's rows as x (and as its unused residual)."""
    from cutetune import bench

    served = []
    monkeypatch.setattr(bench, "ours_runner", reference_runner(served))
    p = problem(num_tokens=9, hidden=512, vocab_size=300)
    found = {c.name: c for c in candidates(KERNEL, p, ServingPlan(H200), CompiledPoints())}
    chain = found[f"{UNFUSED_NAME}: embedding + rmsnorm"]
    assert served[-2:] == [("embedding", p.embedding), ("rmsnorm", p.norm)]
    inputs = make_inputs(p, "cpu", torch.Generator().manual_seed(8))
    expected = reference(inputs, p)
    outputs = chain.run(make_inputs(p, "cpu", torch.Generator().manual_seed(8)))
    check_outputs(KERNEL, p, outputs, expected, roundings=chain.roundings)
    assert int(outputs["error"]) == 1


def test_bench_has_no_chain_for_a_scaled_embedding(monkeypatch):
    from cutetune import bench

    monkeypatch.setattr(bench, "ours_runner", reference_runner([]))
    found = {c.name: c for c in candidates(KERNEL, gemma(num_tokens=3), ServingPlan(H200),
                                           CompiledPoints())}
    chain = found[f"{UNFUSED_NAME}: embedding + rmsnorm"]
    assert chain.run is None
    assert chain.note == ("not run: no chain of our kernels scales the rows by 34 between the "
                          "lookup and the norm")
