"""benchmarks/dependent_load_latency.py's two kernels compile for sm_90a on the CPU, so the
probe still runs when the GPU machine is lent."""


import pytest

from benchmarks import dependent_load_latency


@pytest.mark.parametrize("dependent", [False, True], ids=["copy", "dependent"])
def test_both_copies_compile(dependent):
    assert callable(dependent_load_latency.compiled(2048, dependent))
