"""The embedding lookup fused with RMSNorm on the GPU: every code path's covering points (every
valid point under the `sweep` marker) against the fp32 reference, the residual exactly the
(scaled) rows, the flag for bad ids (raised, zero rows in both outputs, never cleared), short
and padded tables, the token count, the public op against torch's embedding and norm and
against the unfused chain of our ops, a CUDA graph, and the route's refusals."""

from __future__ import annotations

import re

import pytest
import torch

from cutetune.device.specs import DEVICE_SPECS
from cutetune.device.verify import check_outputs, verify
from cutetune.kernels import embedding_rmsnorm as fused
from cutetune.kernels.cache_hints import NORMAL, STREAMING
from cutetune.kernels.dtypes import FLOAT_TOLERANCE, TORCH_DTYPES
from cutetune.kernels.rmsnorm import BLOCK_PER_ROW, WARP_PER_ROW
from testkit.compiled_points import compile_all, compiled
from testkit.covering_points import WHICH_POINTS, selected_points
from testkit.every_point import assert_every_point

pytestmark = pytest.mark.gpu

H200 = DEVICE_SPECS["H200"]
# Odd token count: warp_per_row's last block is partial, so its tail guard is exercised; at
# least BAD_IDS_FROM_TOKENS, so make_inputs puts ids outside the vocabulary in.
TOKENS = 37
VOCAB = 151936
GEMMA_HIDDEN = 1152


def _problem(dtype="bfloat16", hidden=4096, ids="int64", eps=1e-6, weight_bias=0.0,
             scaled=False, vocab=VOCAB, tokens=TOKENS) -> fused.EmbeddingRMSNormProblem:
    scale = fused.rounded_scale(hidden**0.5, dtype) if scaled else 1.0
    return fused.EmbeddingRMSNormProblem(num_tokens=tokens, dtype=dtype, hidden=hidden,
                                         vocab_size=vocab, ids_dtype=ids, eps=eps,
                                         weight_bias=weight_bias, embed_scale=scale)


# Every code path: each dtype, int32 and int64 ids, both forms (a row that fits a warp), a row
# whose vectors do not divide among a block's threads (the predicated last vector), Gemma's
# scale and (1 + w) norm; covering_points adds both cache hints and every vector.
PATHS = [
    pytest.param(_problem(), id="bf16-int64-4096"),
    pytest.param(_problem(hidden=1024, ids="int32"), id="bf16-int32-1024"),
    pytest.param(_problem(dtype="float16", hidden=GEMMA_HIDDEN, ids="int32", weight_bias=1.0,
                          scaled=True, vocab=262144), id="fp16-gemma-scaled"),
    pytest.param(_problem(hidden=GEMMA_HIDDEN, weight_bias=1.0, scaled=True, vocab=262144),
                 id="bf16-gemma-scaled"),
    pytest.param(_problem(dtype="float32", hidden=2880, eps=1e-5, vocab=201088),
                 id="fp32-2880"),
]


@pytest.mark.parametrize("which", WHICH_POINTS)
@pytest.mark.parametrize("problem", PATHS)
def test_points_match_reference(problem, which):
    points = selected_points(which, fused.KERNEL, problem, H200)
    assert {p.cache_hints for p in points} == {NORMAL, STREAMING}
    compile_all(fused.KERNEL, problem, points)
    assert_every_point(points, lambda i, config: verify(
        fused.KERNEL, problem, compiled(fused.KERNEL, problem, config), torch.device("cuda"),
        seed=i), problem.describe())


@pytest.mark.parametrize("tokens", [1, 3, 1000, 70001])
@pytest.mark.parametrize("problem", [_problem(), _problem(hidden=1024)], ids=["4096", "1024"])
def test_token_count_is_dynamic(problem, tokens):
    # 1 and 3 tokens hold no bad id: the flag must stay down.
    default = compiled(fused.KERNEL, problem, fused.default_config(problem, H200))
    verify(fused.KERNEL, problem.with_tokens(tokens), default, torch.device("cuda"),
           seed=tokens)


def _launch(problem, config, ids, weight, error=None):
    """One launch of `config` on explicit ids; the tensors after it, checked against the
    reference, the residual exactly."""
    tokens = len(ids)
    nan = torch.full((tokens, problem.hidden), float("nan"), dtype=weight.dtype, device="cuda")
    tensors = {"ids": ids, "weight": weight,
               "norm_weight": (1 + 0.5 * torch.randn(problem.hidden, device="cuda")).to(
                   weight.dtype),
               "residual": nan, "out": nan.clone(),
               "error": torch.zeros(1, dtype=torch.int32, device="cuda")
               if error is None else error}
    problem = problem.with_tokens(tokens)
    expected = fused.reference(tensors, problem)
    fused.KERNEL.launch(compiled(fused.KERNEL, problem, config), tensors)
    torch.cuda.synchronize()
    check_outputs(fused.KERNEL, problem, tensors, expected)
    assert torch.equal(tensors["residual"].float(), expected["residual"])
    return tensors


CONFIGS = [fused.EmbeddingRMSNormConfig(WARP_PER_ROW, 128, 4, NORMAL),
           fused.EmbeddingRMSNormConfig(BLOCK_PER_ROW, 32, 2, STREAMING)]


@pytest.mark.parametrize("config", CONFIGS, ids=["warp-128b", "block-32b"])
@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_bad_ids_raise_the_flag_and_get_zero_rows(ids_dtype, config):
    name = str(ids_dtype).removeprefix("torch.")
    problem = _problem(hidden=256, ids=name, vocab=40)
    weight = torch.randn(40, 256, device="cuda").bfloat16()
    bad = [-1, 40, 2**31 - 1] + ([2**32 + 3, -(2**32) + 3] if name == "int64" else [])
    ids = torch.tensor([12, *bad, 39], dtype=ids_dtype, device="cuda")
    tensors = _launch(problem, config, ids, weight)
    assert tensors["error"].tolist() == [1]
    assert torch.equal(tensors["residual"][0], weight[12])
    assert torch.equal(tensors["residual"][-1], weight[39])
    assert not tensors["residual"][1:-1].any() and not tensors["out"][1:-1].any()


@pytest.mark.parametrize("config", CONFIGS, ids=["warp-128b", "block-32b"])
def test_the_flag_stays_down_for_good_ids_and_up_once_raised(config):
    problem = _problem(hidden=256, vocab=40)
    weight = torch.randn(40, 256, device="cuda").bfloat16()
    ids = torch.tensor([0, 5, 10, 29, 39], device="cuda")
    assert _launch(problem, config, ids, weight)["error"].tolist() == [0]
    raised = torch.ones(1, dtype=torch.int32, device="cuda")
    assert _launch(problem, config, ids, weight, raised)["error"].tolist() == [1]


def test_a_short_table_flags_the_ids_it_has_no_row_for_and_a_padded_one_reads_its_rows():
    problem = _problem(hidden=256, vocab=40)
    ids = torch.tensor([3, 4, 39, 40], device="cuda")
    short = _launch(problem, CONFIGS[0], ids, torch.randn(4, 256, device="cuda").bfloat16())
    assert short["error"].tolist() == [1] and not short["residual"][1:].any()
    table = torch.randn(48, 256, device="cuda").bfloat16()
    padded = _launch(problem, CONFIGS[0], ids, table)
    assert padded["error"].tolist() == [1]  # 40: past the vocabulary, a padding row's id
    assert torch.equal(padded["residual"][:3], table[[3, 4, 39]])
    assert not padded["residual"][3].any() and not padded["out"][3].any()


def _torch_first_layer_input(ids, weight, norm_weight, eps, bias, scale=None):
    rows = torch.nn.functional.embedding(ids, weight)
    if scale is not None:
        rows = rows * torch.tensor(scale).to(weight.dtype)
    x = rows.float()
    out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (norm_weight.float() + bias)
    return out, rows


@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_public_op_is_llama_s_embedding_and_input_layernorm(ids_dtype):
    import cutetune

    weight = torch.randn(128256, 4096, device="cuda").bfloat16()
    norm_weight = (1 + 0.5 * torch.randn(4096, device="cuda")).bfloat16()
    ids = torch.randint(0, 128256, (257,), device="cuda", dtype=ids_dtype)
    error = torch.zeros(1, dtype=torch.int32, device="cuda")
    out, residual = cutetune.embedding_rmsnorm(ids, weight, norm_weight, eps=1e-5, error=error)
    expected_out, rows = _torch_first_layer_input(ids, weight, norm_weight, 1e-5, 0.0)
    assert torch.equal(residual, rows)
    rtol, atol = FLOAT_TOLERANCE["bfloat16"]
    torch.testing.assert_close(out.float(), expected_out, rtol=rtol, atol=atol)
    assert error.tolist() == [0]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_public_op_is_gemma_s_scaled_embedding_and_input_layernorm(dtype):
    import cutetune

    torch_dtype = TORCH_DTYPES[dtype]
    weight = torch.randn(262144, GEMMA_HIDDEN, device="cuda").to(torch_dtype)
    norm_weight = (0.5 * torch.randn(GEMMA_HIDDEN, device="cuda")).to(torch_dtype)
    ids = torch.randint(0, 262144, (300,), device="cuda")
    out, residual = cutetune.embedding_rmsnorm(ids, weight, norm_weight, weight_bias=1.0,
                                               embed_scale=GEMMA_HIDDEN**0.5)
    expected_out, rows = _torch_first_layer_input(ids, weight, norm_weight, 1e-6, 1.0,
                                                  GEMMA_HIDDEN**0.5)
    assert torch.equal(residual, rows)
    rtol, atol = FLOAT_TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), expected_out, rtol=rtol, atol=atol)


def test_public_op_agrees_with_the_unfused_chain_of_our_ops():
    import cutetune

    weight = torch.randn(151936, 5120, device="cuda").bfloat16()
    norm_weight = (1 + 0.5 * torch.randn(5120, device="cuda")).bfloat16()
    ids = torch.randint(0, 151936, (513,), device="cuda")
    out, residual = cutetune.embedding_rmsnorm(ids, weight, norm_weight)
    rows = cutetune.embedding(ids, weight)
    assert torch.equal(residual, rows)
    rtol, atol = FLOAT_TOLERANCE["bfloat16"]
    torch.testing.assert_close(out, cutetune.rmsnorm(rows, norm_weight), rtol=rtol, atol=atol)


def test_public_op_captures_into_a_cuda_graph():
    import cutetune

    weight = torch.randn(40, 512, device="cuda").bfloat16()
    norm_weight = (1 + 0.5 * torch.randn(512, device="cuda")).bfloat16()
    ids = torch.tensor([12, 3, 29, 15], device="cuda")
    out = torch.empty(4, 512, dtype=torch.bfloat16, device="cuda")
    residual = torch.empty_like(out)
    error = torch.zeros(1, dtype=torch.int32, device="cuda")
    cutetune.embedding_rmsnorm(ids, weight, norm_weight, residual=residual, out=out,
                               error=error)  # compile outside
    torch.cuda.synchronize()
    assert error.tolist() == [0]
    out.fill_(float("nan"))
    residual.fill_(float("nan"))
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        cutetune.embedding_rmsnorm(ids, weight, norm_weight, residual=residual, out=out,
                                   error=error)
    # The replay reads the ids as they are now: one of them outside the vocabulary of 40.
    ids.copy_(torch.tensor([10, 11, 41, 0], device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    expected_out, rows = _torch_first_layer_input(ids.clamp(max=39), weight, norm_weight, 1e-6,
                                                  0.0)
    assert torch.equal(residual[[0, 1, 3]], rows[[0, 1, 3]]) and not residual[2].any()
    rtol, atol = FLOAT_TOLERANCE["bfloat16"]
    torch.testing.assert_close(out[[0, 1, 3]].float(), expected_out[[0, 1, 3]], rtol=rtol,
                               atol=atol)
    assert not out[2].any() and error.tolist() == [1]


def _good():
    return (torch.tensor([1, 2, 3, 4, 5], device="cuda"),
            torch.randn(64, 256, device="cuda").bfloat16(),
            torch.randn(256, device="cuda").bfloat16())


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda i, w, n: (i.float(), w, n), "ids has dtype torch.float32"),
    (lambda i, w, n: (i[:, None], w, n), "ids must be a contiguous (tokens,) tensor"),
    (lambda i, w, n: (i, w.flatten()[4:4 + 63 * 256].view(63, 256), n),
     "weight must start 16-byte aligned"),
    (lambda i, w, n: (i, w, n.float()), "norm_weight has dtype torch.float32"),
    (lambda i, w, n: (i, w, n.repeat(2)[1:257]), "norm_weight must start 16-byte aligned"),
])
def test_public_op_rejects_bad_input_after_a_good_call(mutate, message):
    # The good call makes the route serve this key; the bad one must still meet the op's
    # checks (the compiled kernel refuses it before any launch, then the checked path names
    # the argument).
    import cutetune

    cutetune.embedding_rmsnorm(*_good())
    with pytest.raises((TypeError, ValueError), match=re.escape(message)):
        cutetune.embedding_rmsnorm(*mutate(*_good()))


def test_public_op_refuses_a_rank_s_range_after_a_good_call():
    import cutetune

    ids, weight, norm_weight = _good()
    cutetune.embedding_rmsnorm(ids, weight, norm_weight)
    with pytest.raises(ValueError, match=re.escape("takes the whole vocabulary [0, 64), got "
                                                   "[0, 32)")):
        cutetune.embedding_rmsnorm(ids, weight, norm_weight, vocab_end=32)
