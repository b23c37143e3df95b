"""The GPU suite's session: the compile pool that compiled_points starts is stopped at its end."""

import pytest

from testkit.compiled_points import close_pool


@pytest.fixture(scope="session", autouse=True)
def _compile_pool_closed_at_the_end():
    yield
    close_pool()
