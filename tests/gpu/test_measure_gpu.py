"""Interleaved timing on the GPU: real graphs, each set timed as time_in_graph times it alone."""

from __future__ import annotations

import pytest
import torch

from cutetune.device.measure import INTERLEAVED_ROUNDS, REPEATS, time_in_graph, time_interleaved

# Compares times it measures: the GPU to itself (tests/gpu/conftest.py).
pytestmark = [pytest.mark.gpu, pytest.mark.timing]


def test_time_interleaved_gives_each_set_its_own_time_in_order():
    small = torch.zeros(2**20, device="cuda")  # 4 MB: stays in L2
    big = torch.zeros(2**26, device="cuda")  # 256 MB each way: DRAM-bound, about 0.1 ms
    fast, slow = time_interleaved([[lambda: small.add_(1)], [lambda: big.add_(1)]])
    assert fast.repeats == slow.repeats == INTERLEAVED_ROUNDS * (REPEATS // INTERLEAVED_ROUNDS)
    assert slow.median_us > 10 * fast.median_us
    alone = time_in_graph([lambda: big.add_(1)])
    assert abs(alone.median_us - slow.median_us) < 0.05 * alone.median_us
