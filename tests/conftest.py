"""Shared test setup: compile for sm_90a on machines without a GPU, skip GPU tests there, give
the tests that time kernels the GPU to themselves, and run the every-point sweeps only when
asked for."""

import fcntl
import os

# CuTeDSL reads the target when it is first imported; set it before any test module imports
# cutlass, so every compile test runs on the CPU machine (an explicit setting still wins).
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")

import pytest  # noqa: E402

from testkit.databases import BACKENDS, NO_SERVER, postgres_server_url, scratch_url  # noqa: E402


@pytest.fixture(params=BACKENDS)
def database_url(request, tmp_path):
    """The URL of an empty database on each backend: a SQLite file, and a schema of its own on
    the PostgreSQL server of CUTETUNE_TEST_POSTGRES_URL (skipped, saying so, without one)."""
    if request.param == "postgresql" and postgres_server_url() is None:
        pytest.skip(NO_SERVER)
    with scratch_url(request.param, tmp_path) as url:
        yield url


@pytest.fixture(scope="session")
def run_directory(tmp_path_factory):
    """A folder of this pytest run shared by all its xdist workers (pytest keeps the last few
    runs', then deletes)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(autouse=True)
def _gpu_shared_or_alone(request):
    """A test marked `timing` compares times it measures, so it holds an exclusive lock that
    every other `gpu` test, wherever it sits, holds shared: no other worker's kernels (a tuning
    run's included) run beside it."""
    if request.node.get_closest_marker("gpu") is None:
        yield
        return
    alone = request.node.get_closest_marker("timing") is not None
    with open(request.getfixturevalue("run_directory") / "gpu.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        yield


def pytest_collection_modifyitems(config, items):
    _skip_sweeps_unless_selected(config, items)
    _skip_gpu_tests_without_a_gpu(items)


def _skip_sweeps_unless_selected(config, items) -> None:
    # A sweep repeats, at every point, what the covering points already check on every code
    # path: too slow for every run. `-m sweep` (or `-m "gpu and sweep"`) runs them. An addopts
    # `-m "not sweep"` would not do: a user's `-m gpu` replaces it and runs the sweeps.
    if "sweep" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="every-point sweep: run with -m sweep")
    for item in items:
        if item.get_closest_marker("sweep"):
            item.add_marker(skip)


def _skip_gpu_tests_without_a_gpu(items) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run through the device tool)")
    for item in gpu_items:
        item.add_marker(skip)
