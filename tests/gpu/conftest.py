"""The GPU suite's session: one artifact directory for the compiled points of the whole run
(every xdist worker's) and the compile pool stopped at the end. The suite runs as
`python3 -m pytest -q -m gpu -n 8 tests`: compiling is most of its work and the machine has 16
cores; tests/conftest.py gives the tests that time kernels the GPU to themselves."""

import pytest

from testkit.compiled_points import close_pool, use_directory


@pytest.fixture(scope="session", autouse=True)
def _compiled_points(run_directory):
    use_directory(run_directory / "compiled-points")
    yield
    close_pool()
