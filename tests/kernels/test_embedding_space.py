"""embedding's Problem, Config space, seed heuristic, cost, reference, check, inputs and model
problems (no compiling)."""

import math

import pytest
import torch

from cutetune.device.roofline import predict
from cutetune.device.specs import DEVICE_SPECS, Ceilings
from cutetune.kernels.cache_hints import NORMAL, STREAMING
from cutetune.kernels.cost import resident_blocks_per_sm
from cutetune.kernels.embedding import (
    BAD_IDS_FROM_TOKENS,
    INPUT_ROWS_PER_TOKEN,
    KERNEL,
    SPACE,
    EmbeddingConfig,
    EmbeddingProblem,
    check,
    cost,
    default_config,
    make_inputs,
    problems_for_model,
    reference,
)
from cutetune.kernels.registry import NotApplicableError, VerificationError, get_kernel
from cutetune.spaces.models import PRESETS, ModelShape, load_model

H200 = DEVICE_SPECS["H200"]
DTYPES = ("bfloat16", "float16", "float32")


def problem(**overrides) -> EmbeddingProblem:
    values = dict(num_tokens=1, dtype="bfloat16", hidden=4096, vocab_size=151936,
                  vocab_start=0, vocab_end=151936, ids_dtype="int64")
    values.update(overrides)
    return EmbeddingProblem(**values)


def test_registered_under_its_name():
    assert get_kernel("embedding") is KERNEL
    assert KERNEL.space is SPACE
    assert KERNEL.problem_type is EmbeddingProblem
    assert KERNEL.check is check  # the flag is an int32: compared exactly, like out


@pytest.mark.parametrize(("field", "value", "message"), [
    ("dtype", "int8", "dtype 'int8' not supported"),
    ("hidden", 0, "hidden must be a positive integer"),
    ("vocab_size", True, "vocab_size must be a positive integer"),
    ("vocab_start", -1, r"rows \[-1, 151936\) must be a non-empty range"),
    ("vocab_start", 151936, r"rows \[151936, 151936\) must be a non-empty range"),
    ("vocab_end", 151937, r"within the vocabulary \[0, 151936\)"),
    ("ids_dtype", "int16", "ids_dtype 'int16' not supported"),
    ("num_tokens", 0, "num_tokens must be a positive integer"),
])
def test_problem_validation(field, value, message):
    with pytest.raises(ValueError, match=message):
        problem(**{field: value})


def test_a_vocabulary_of_2_to_the_31_is_refused():
    with pytest.raises(ValueError, match="must be below 2"):
        problem(vocab_size=2**31, vocab_end=2**31)


def test_problem_key_is_static_part_only():
    assert problem(num_tokens=1).static_key() == problem(num_tokens=4096).static_key()
    assert problem().static_tuple() == ("bfloat16", 4096, 151936, 0, 151936, "int64")
    assert problem().static_key() != problem(vocab_start=75968).static_key()
    assert problem(vocab_start=75968).rows == 75968


# ---------------------------------------------------------------------------------------------
# Model problems


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_has_its_whole_table(name):
    model = PRESETS[name]
    (p,) = problems_for_model(model, "bfloat16")
    assert (p.hidden, p.vocab_size, p.vocab_start, p.vocab_end, p.ids_dtype) == (
        model.hidden_size, model.vocab_size, 0, model.vocab_size, "int64")


@pytest.mark.parametrize(("name", "hidden", "vocab"), [
    ("qwen3-8b", 4096, 151936), ("llama-3.1-8b", 4096, 128256), ("deepseek-v3", 7168, 129280),
])
def test_preset_tables(name, hidden, vocab):
    (p,) = problems_for_model(load_model(name), "bfloat16")
    assert (p.hidden, p.vocab_size) == (hidden, vocab)


def test_not_applicable_without_a_vocabulary():
    model = ModelShape("no-vocab", 1024, 16, 8, 64, 1e-6, False)
    with pytest.raises(NotApplicableError, match="no vocab_size"):
        problems_for_model(model, "bfloat16")


# ---------------------------------------------------------------------------------------------
# Space, heuristic, cost

SHAPES = (1024, 2880, 4096, 5376, 7168, 2 * 3 * 5)  # 30: only 32-bit vectors of 16-bit types


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", SHAPES)
@pytest.mark.parametrize("tokens", (1, 64, 32768))
def test_default_config_is_a_valid_point(hidden, dtype, tokens):
    p = problem(dtype=dtype, hidden=hidden, num_tokens=tokens)
    config = default_config(p, H200)
    SPACE.check(p, config, H200)
    assert config.cache_hints == NORMAL
    assert config.vectors_per_thread * config.vector_bits >= 128


def test_default_config_by_size():
    assert default_config(problem(), H200) == EmbeddingConfig(128, 1, 1, NORMAL)
    assert default_config(problem(num_tokens=32768), H200) == EmbeddingConfig(128, 1, 8, NORMAL)
    assert default_config(problem(dtype="float16", hidden=30), H200) == EmbeddingConfig(
        32, 4, 1, NORMAL)


def test_a_hidden_no_vector_divides_is_refused_by_its_constraint():
    p = problem(dtype="float16", hidden=4097)
    enumeration = SPACE.enumerate(p, H200)
    assert not enumeration.valid
    assert set(enumeration.rejections_by_constraint()) == {"hidden_splits_into_vectors"}
    with pytest.raises(ValueError, match="hidden_splits_into_vectors"):
        default_config(p, H200)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", SHAPES)
def test_every_valid_point_tiles_the_rows(hidden, dtype):
    p = problem(dtype=dtype, hidden=hidden)
    valid = SPACE.enumerate(p, H200).valid
    assert valid
    for config in valid:
        vec = config.vector_bits // (8 * torch.tensor([], dtype=getattr(torch, dtype))
                                     .element_size())
        assert hidden % vec == 0
    # The space holds both hints and every vector the row allows.
    assert {c.cache_hints for c in valid} == {NORMAL, STREAMING}


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_valid_point_is_resident_on_every_device(dtype):
    for device in DEVICE_SPECS.values():
        for tokens in (1, 4096):
            p = problem(dtype=dtype, num_tokens=tokens)
            for config in SPACE.enumerate(p, device).valid:
                c = cost(p, config, device)
                assert resident_blocks_per_sm(c, device) >= 1, (device.name, config)
                assert predict(c, device, Ceilings.from_datasheet(device)).predicted_us > 0


def test_cost_by_hand():
    # 3 tokens of hidden 4096 bf16 with int32 ids: 3 ids of 4 bytes, 3 rows read and written.
    p = problem(num_tokens=3, ids_dtype="int32")
    c = cost(p, EmbeddingConfig(64, 2, 4, NORMAL), H200)
    assert c.bytes_moved == 3 * 4 + 2 * 3 * 4096 * 2
    assert c.flops == 0
    # 3 * 4096 / 4 vectors, 4 warps of 2 each per block.
    assert c.blocks == math.ceil(3 * 1024 / 256) == 12
    assert c.threads_per_block == 128
    assert c.bytes_in_flight_per_thread == 2 * 8


# ---------------------------------------------------------------------------------------------
# Reference, check and inputs


def _tensors(ids, rows=6, hidden=8, dtype=torch.bfloat16):
    weight = torch.arange(rows * hidden, dtype=torch.float32).reshape(rows, hidden).to(dtype)
    return {"ids": ids, "weight": weight, "out": torch.empty(len(ids), hidden, dtype=dtype),
            "error": torch.zeros(1, dtype=torch.int32)}


@pytest.mark.parametrize("ids_dtype", (torch.int32, torch.int64))
def test_reference_gathers_the_rank_rows_and_zeroes_the_rest(ids_dtype):
    # This rank holds ids [10, 16) of a vocabulary of 20.
    p = problem(hidden=8, vocab_size=20, vocab_start=10, vocab_end=16,
                ids_dtype=str(ids_dtype).removeprefix("torch."), num_tokens=4)
    t = _tensors(torch.tensor([10, 15, 9, 16], dtype=ids_dtype))
    expected = reference(t, p)
    w = t["weight"].float()
    assert torch.equal(expected["out"], torch.stack([w[0], w[5], torch.zeros(8), torch.zeros(8)]))
    assert expected["error"].tolist() == [0]


@pytest.mark.parametrize("bad", (-1, 20, 2**32 + 10))
def test_reference_flags_an_id_outside_the_vocabulary_and_zeroes_its_row(bad):
    p = problem(hidden=8, vocab_size=20, vocab_start=10, vocab_end=16, num_tokens=2)
    t = _tensors(torch.tensor([11, bad]))
    expected = reference(t, p)
    assert expected["error"].tolist() == [1]
    assert torch.equal(expected["out"][1], torch.zeros(8))
    assert torch.equal(expected["out"][0], t["weight"][1].float())


def test_a_padded_table_reads_the_range_only():
    """vLLM pads a rank's shard: rows past the range are never read."""
    p = problem(hidden=8, vocab_size=20, vocab_start=10, vocab_end=16, num_tokens=3)
    t = _tensors(torch.tensor([15, 16, 17]), rows=8)
    expected = reference(t, p)
    assert torch.equal(expected["out"][0], t["weight"][5].float())
    assert torch.equal(expected["out"][1:], torch.zeros(2, 8))
    assert expected["error"].tolist() == [0]


def test_an_id_of_the_rank_past_its_table_is_flagged_and_reads_nothing():
    p = problem(hidden=8, vocab_size=20, vocab_start=10, vocab_end=16, num_tokens=2)
    t = _tensors(torch.tensor([13, 14]), rows=4)
    expected = reference(t, p)
    assert torch.equal(expected["out"][0], t["weight"][3].float())
    assert torch.equal(expected["out"][1], torch.zeros(8))
    assert expected["error"].tolist() == [1]


def test_reference_leaves_a_raised_flag_raised():
    p = problem(hidden=8, vocab_size=20, vocab_start=10, vocab_end=16, num_tokens=1)
    t = _tensors(torch.tensor([11]))
    t["error"].fill_(1)
    assert reference(t, p)["error"].tolist() == [1]


def test_reference_matches_torch_embedding_on_one_rank():
    p = problem(hidden=8, vocab_size=6, vocab_start=0, vocab_end=6, num_tokens=5)
    t = _tensors(torch.tensor([5, 0, 3, 3, 1]))
    expected = reference(t, p)["out"]
    assert torch.equal(expected, torch.nn.functional.embedding(t["ids"], t["weight"]).float())


def test_ranks_sum_to_the_whole_table():
    """Each id's row comes from exactly one rank, so summing the ranks' outputs (the
    all-reduce) gives torch's embedding of the whole table."""
    whole = torch.randn(20, 8).to(torch.bfloat16)
    ids = torch.tensor([0, 7, 8, 19, 13, 7])
    total = torch.zeros(6, 8)
    for start, end in ((0, 8), (8, 16), (16, 20)):
        p = problem(hidden=8, vocab_size=20, vocab_start=start, vocab_end=end, num_tokens=6)
        total += reference({"ids": ids, "weight": whole[start:end],
                            "error": torch.zeros(1, dtype=torch.int32)}, p)["out"]
    assert torch.equal(total, torch.nn.functional.embedding(ids, whole).float())


def test_check_passes_the_exact_rows_and_names_what_is_off():
    p = problem(hidden=8, vocab_size=20, vocab_start=10, vocab_end=16, num_tokens=3)
    t = _tensors(torch.tensor([10, 3, 12]))
    expected = reference(t, p)
    outputs = {"out": expected["out"].to(torch.bfloat16), "error": expected["error"].clone()}
    check(outputs, expected, p)
    outputs["out"][2, 5] = float("nan")
    with pytest.raises(VerificationError, match="out: 1 of 24 elements .* token 2, column 5"):
        check(outputs, expected, p)
    outputs["out"][2, 5] = expected["out"][2, 5]
    outputs["error"].fill_(1)
    with pytest.raises(VerificationError, match=r"error: got \[1\], expected \[0\]"):
        check(outputs, expected, p)


@pytest.mark.parametrize("ids_dtype", ("int32", "int64"))
@pytest.mark.parametrize(("start", "end"), ((0, 1000), (250, 500)))
@pytest.mark.parametrize("tokens", (1, BAD_IDS_FROM_TOKENS, 300))
def test_inputs(tokens, start, end, ids_dtype):
    p = problem(hidden=16, vocab_size=1000, vocab_start=start, vocab_end=end, num_tokens=tokens,
                ids_dtype=ids_dtype)
    t = make_inputs(p, "cpu", torch.Generator().manual_seed(3))
    ids = t["ids"].to(torch.int64)
    assert t["ids"].dtype == getattr(torch, ids_dtype) and ids.shape == (tokens,)
    rows = min(end - start, INPUT_ROWS_PER_TOKEN * tokens)
    assert t["weight"].shape == (rows, 16) and t["out"].shape == (tokens, 16)
    assert t["error"].tolist() == [0]
    bad = (ids < 0) | (ids >= 1000)
    assert int(bad.sum()) == (2 if tokens >= BAD_IDS_FROM_TOKENS else 0)
    if ids_dtype == "int64" and bad.any():
        assert (ids == 2**32 + start).sum() == 1  # in range if read in 32 bits
    good = ids[~bad]
    own = (good >= start) & (good < end)
    # The rank's ids index the rows allocated; other ranks' ids lie outside its range.
    assert (good[own] < start + rows).all()
    if tokens == 300:
        assert own.any() and (own.all() == (end - start == 1000))
    expected = reference(t, p)
    assert expected["error"].tolist() == [int(bad.any())]


def test_inputs_differ_by_seed():
    p = problem(hidden=16, num_tokens=64)
    first = make_inputs(p, "cpu", torch.Generator().manual_seed(1))
    second = make_inputs(p, "cpu", torch.Generator().manual_seed(2))
    assert not torch.equal(first["ids"], second["ids"])
    assert not torch.equal(first["weight"], second["weight"])
