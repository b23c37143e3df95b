"""The ceilings step on the GPU (issue 42 item 1): it measures the grid barrier's cost beside
the copy ceiling and the launch floor, and the values are in the range seen on Hopper."""

from __future__ import annotations

import pytest

from cutetune.device.ceilings import measure_ceilings

pytestmark = [pytest.mark.gpu, pytest.mark.timing]


def test_ceilings_measure_the_grid_barrier_too():
    ceilings = measure_ceilings()
    assert set(ceilings) == {"copy_gbps", "launch_floor_us", "grid_barrier_us"}
    # H200: about 1 us across 132 blocks (DESIGN.md), the copy ceiling 4.2 TB/s, the launch
    # floor 0.55 us; generous bounds, for any Hopper part.
    assert 0.2 < ceilings["grid_barrier_us"] < 5.0
    assert 2000 < ceilings["copy_gbps"] < 6000
    assert 0.2 < ceilings["launch_floor_us"] < 3.0
