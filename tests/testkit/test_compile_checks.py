"""The compile checks' params: one per distinct static problem of the presets, so that a problem
two presets share compiles once."""

from cutetune.kernels.registry import NotApplicableError, get_kernel
from cutetune.spaces.models import PRESETS
from testkit.compile_checks import preset_params, presets_of


def _preset_keys(kernel) -> dict[str, set[str]]:
    keys = {}
    for name, model in PRESETS.items():
        try:
            keys[name] = {p.static_key() for p in kernel.problems_for_model(model, "bfloat16")}
        except NotApplicableError:
            continue
    return keys


def test_a_problem_two_presets_share_is_one_param_named_after_the_first():
    kernel = get_kernel("rope")
    by_preset = _preset_keys(kernel)
    params = preset_params(kernel)
    keys = [p.values[0].static_key() for p in params]
    assert len(keys) == len(set(keys)) == len(set().union(*by_preset.values()))
    # llama-3.1-8b-fp4 differs from llama-3.1-8b only in its quantisation: no rope problem of
    # its own.
    assert by_preset["llama-3.1-8b-fp4"] == by_preset["llama-3.1-8b"]
    assert "llama-3.1-8b" in {p.id for p in params}
    assert "llama-3.1-8b-fp4" not in {p.id for p in params}
    assert presets_of(kernel) == set(by_preset)


def test_a_suffix_tells_apart_the_problems_of_one_preset():
    kernel = get_kernel("rmsnorm")
    params = preset_params(kernel, lambda problem: f"{problem.hidden}-{problem.fused_add}")
    ids = [p.id for p in params]
    assert len(ids) == len(set(ids))
    assert {p.values[0].static_key() for p in params} == set().union(
        *_preset_keys(kernel).values())
