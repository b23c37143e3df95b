"""The embedding lookup on the GPU: every code path's covering points (every valid point under
the `sweep` marker) against the exact reference, the flag for ids outside the vocabulary
(raised, zero rows, never cleared), int64 ids that would alias a row in 32 bits, short and
padded tables, the token count, the public op against torch's embedding and across ranks, a
CUDA graph, and the route's refusals."""

from __future__ import annotations

import itertools
import re

import pytest
import torch

from cutetune.device.specs import DEVICE_SPECS
from cutetune.device.verify import check_outputs, verify
from cutetune.kernels import embedding
from cutetune.kernels.cache_hints import NORMAL, STREAMING
from testkit.compiled_points import compile_all, compiled
from testkit.covering_points import WHICH_POINTS, selected_points
from testkit.every_point import assert_every_point

pytestmark = pytest.mark.gpu

H200 = DEVICE_SPECS["H200"]
# Odd token count: the last block is partial, so the tail guard is exercised; at least
# BAD_IDS_FROM_TOKENS, so make_inputs puts ids outside the vocabulary in.
TOKENS = 37
VOCAB = 151936


def _problem(dtype="bfloat16", hidden=4096, start=0, end=VOCAB, ids="int64",
             tokens=TOKENS) -> embedding.EmbeddingProblem:
    return embedding.EmbeddingProblem(num_tokens=tokens, dtype=dtype, hidden=hidden,
                                      vocab_size=VOCAB, vocab_start=start, vocab_end=end,
                                      ids_dtype=ids)


# Every code path: each dtype, int32 and int64 ids, the whole table and a rank's range, a
# hidden only 32-bit vectors divide; covering_points adds both cache hints and every vector.
PATHS = [
    pytest.param(_problem(), id="bf16-int64-whole"),
    pytest.param(_problem(start=37984, end=75968, ids="int32"), id="bf16-int32-rank"),
    pytest.param(_problem(dtype="float16", hidden=1024, start=113952, end=VOCAB),
                 id="fp16-int64-last-rank"),
    pytest.param(_problem(dtype="float32", hidden=2880, start=37984, end=75968),
                 id="fp32-int64-rank"),
    pytest.param(_problem(dtype="float16", hidden=30, ids="int32"), id="fp16-narrow-int32"),
]


@pytest.mark.parametrize("which", WHICH_POINTS)
@pytest.mark.parametrize("problem", PATHS)
def test_points_match_reference(problem, which):
    points = selected_points(which, embedding.KERNEL, problem, H200)
    assert {p.cache_hints for p in points} == {NORMAL, STREAMING}
    compile_all(embedding.KERNEL, problem, points)
    assert_every_point(points, lambda i, config: verify(
        embedding.KERNEL, problem, compiled(embedding.KERNEL, problem, config),
        torch.device("cuda"), seed=i), problem.describe())


@pytest.mark.parametrize("tokens", [1, 3, 1000, 70001])
def test_token_count_is_dynamic(tokens):
    # 1 and 3 tokens hold no bad id: the flag must stay down.
    problem = _problem(start=37984, end=75968)
    default = compiled(embedding.KERNEL, problem, embedding.default_config(problem, H200))
    verify(embedding.KERNEL, problem.with_tokens(tokens), default, torch.device("cuda"),
           seed=tokens)


def _launch(problem, config, ids, weight, error=None):
    """One launch of `config` on explicit ids; the tensors after it, and the reference."""
    tensors = {"ids": ids, "weight": weight,
               "out": torch.full((len(ids), problem.hidden), float("nan"), dtype=weight.dtype,
                                 device="cuda"),
               "error": torch.zeros(1, dtype=torch.int32, device="cuda")
               if error is None else error}
    expected = embedding.reference(tensors, problem)
    embedding.KERNEL.launch(compiled(embedding.KERNEL, problem, config), tensors)
    torch.cuda.synchronize()
    check_outputs(embedding.KERNEL, problem, tensors, expected)
    return tensors


CONFIGS = [embedding.EmbeddingConfig(128, 1, 1, NORMAL),
           embedding.EmbeddingConfig(32, 4, 8, STREAMING)]


@pytest.mark.parametrize("config", CONFIGS, ids=["128b", "32b-x4"])
@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_ids_outside_the_vocabulary_raise_the_flag_and_get_zero_rows(ids_dtype, config):
    name = str(ids_dtype).removeprefix("torch.")
    problem = _problem(start=10, end=30, ids=name, hidden=256)
    weight = torch.randn(20, 256, device="cuda").bfloat16()
    bad = [-1, VOCAB, 2**31 - 1] + ([2**32 + 10, -(2**32) + 10] if name == "int64" else [])
    ids = torch.tensor([12, *bad, 29], dtype=ids_dtype, device="cuda")
    tensors = _launch(problem, config, ids, weight)
    assert tensors["error"].tolist() == [1]
    assert torch.equal(tensors["out"][0], weight[2]) and torch.equal(tensors["out"][-1],
                                                                      weight[19])
    assert not tensors["out"][1:-1].any()


@pytest.mark.parametrize("config", CONFIGS, ids=["128b", "32b-x4"])
def test_the_flag_stays_down_for_good_ids_and_up_once_raised(config):
    problem = _problem(start=10, end=30, hidden=256)
    weight = torch.randn(20, 256, device="cuda").bfloat16()
    ids = torch.tensor([0, 5, 10, 29, 30, VOCAB - 1], device="cuda")  # other ranks' and ours
    assert _launch(problem, config, ids, weight)["error"].tolist() == [0]
    raised = torch.ones(1, dtype=torch.int32, device="cuda")
    assert _launch(problem, config, ids, weight, raised)["error"].tolist() == [1]


def test_a_short_table_flags_the_ids_it_has_no_row_for_and_a_padded_one_reads_its_range():
    problem = _problem(start=10, end=30, hidden=256)
    ids = torch.tensor([13, 14, 29, 30, 33], device="cuda")
    short = _launch(problem, CONFIGS[0], ids, torch.randn(4, 256, device="cuda").bfloat16())
    assert short["error"].tolist() == [1] and not short["out"][1:].any()
    padded = _launch(problem, CONFIGS[0], ids, torch.randn(24, 256, device="cuda").bfloat16())
    assert padded["error"].tolist() == [0] and not padded["out"][3:].any()


@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_public_op_is_torchs_embedding_on_a_whole_table(ids_dtype):
    import cutetune

    weight = torch.randn(VOCAB, 4096, device="cuda").bfloat16()
    ids = torch.randint(0, VOCAB, (257,), device="cuda", dtype=ids_dtype)
    error = torch.zeros(1, dtype=torch.int32, device="cuda")
    out = cutetune.embedding(ids, weight, error=error)
    assert torch.equal(out, torch.nn.functional.embedding(ids, weight))
    assert error.tolist() == [0]


def test_public_op_ranks_sum_to_the_table():
    import cutetune

    whole = torch.randn(VOCAB, 1024, device="cuda").half()
    ids = torch.randint(0, VOCAB, (300,), device="cuda")
    bounds = [0, 37984, 75968, 113952, VOCAB]
    total = sum(cutetune.embedding(ids, whole[start:end], start, end, VOCAB).float()
                for start, end in itertools.pairwise(bounds))
    assert torch.equal(total, torch.nn.functional.embedding(ids, whole).float())


def test_public_op_captures_into_a_cuda_graph():
    import cutetune

    weight = torch.randn(20, 512, device="cuda").bfloat16()
    ids = torch.tensor([12, 3, 29, 15], device="cuda")
    out = torch.empty(4, 512, dtype=torch.bfloat16, device="cuda")
    error = torch.zeros(1, dtype=torch.int32, device="cuda")
    cutetune.embedding(ids, weight, 10, 30, 40, out=out, error=error)  # compile outside
    torch.cuda.synchronize()
    assert error.tolist() == [0]
    out.fill_(float("nan"))
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        cutetune.embedding(ids, weight, 10, 30, 40, out=out, error=error)
    # The replay reads the ids as they are now: one of them outside the vocabulary of 40.
    ids.copy_(torch.tensor([10, 11, 41, 0], device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out[:2], weight[:2]) and not out[2:].any()
    assert error.tolist() == [1]


def _good():
    return (torch.tensor([1, 2, 3, 4, 5], device="cuda"),
            torch.randn(64, 256, device="cuda").bfloat16())


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda i, w: (i.float(), w), "ids has dtype torch.float32"),
    (lambda i, w: (i, w.half()[:, :3].contiguous()), "hidden 3 (weight.shape[1])"),
    (lambda i, w: (i[:, None], w), "ids must be a contiguous (tokens,) tensor"),
    (lambda i, w: (i, w.flatten()[4:4 + 63 * 256].view(63, 256)),
     "weight must start 16-byte aligned"),
])
def test_public_op_rejects_bad_input_after_a_good_call(mutate, message):
    # The good call makes the route serve this key; the bad one must still meet the op's
    # checks (the compiled kernel refuses it before any launch, then the checked path names
    # the argument).
    import cutetune

    cutetune.embedding(*_good())
    with pytest.raises((TypeError, ValueError), match=re.escape(message)):
        cutetune.embedding(*mutate(*_good()))
