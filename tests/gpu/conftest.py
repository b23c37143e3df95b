"""The GPU suite's session: one artifact directory for the compiled points of the whole run
(every xdist worker's), the compile pool stopped at the end, and the GPU to itself for the
tests that time kernels.

The suite runs as `python3 -m pytest -q -m gpu -n 8 tests/gpu`: compiling is most of its work
and the machine has 16 cores. A test marked `timing` compares times it measures, so it holds
an exclusive lock that every other GPU test holds shared: no other worker's kernels run beside
it.
"""

import fcntl
import os

import pytest

from testkit.compiled_points import close_pool, use_directory


@pytest.fixture(scope="session", autouse=True)
def _run_directory(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    # A worker's base is a folder of the run's (pytest keeps the last few runs', then deletes).
    run = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    use_directory(run / "compiled-points")
    yield run
    close_pool()


@pytest.fixture(autouse=True)
def _gpu_shared_or_alone(request, _run_directory):
    alone = request.node.get_closest_marker("timing") is not None
    with open(_run_directory / "gpu.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        yield
