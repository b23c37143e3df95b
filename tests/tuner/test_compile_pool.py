"""The artifact store and the compile pool, compiling the fault kernel's points for sm_90a."""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from cutetune.build.artifacts import RUNTIME_LIBRARIES, ArtifactStore, clear_artifacts
from cutetune.build.compile_pool import CompileHandler, CompilePool, CompileResult
from cutetune.build.publish import content_digest
from cutetune.spaces.space import config_to_json
from testkit.child_process import child_env
from testkit.fault_kernel import KERNEL, FaultConfig, FaultProblem

PROBLEM = FaultProblem(num_tokens=1)
OK, OTHER = FaultConfig("ok", 1), FaultConfig("ok", 2)


class CrashOnSlow(CompileHandler):
    """A compiler that dies on the 'slow' point, as a crashing MLIR pass would."""

    def __call__(self, request):
        if request[2].behaviour == "slow":
            os.kill(os.getpid(), signal.SIGSEGV)
        return super().__call__(request)


class ReportEnvironment(CompileHandler):
    """Compiles nothing: answers with the process's GPU visibility and target arch (in the
    one string a result carries)."""

    def __call__(self, request):
        return CompileResult(f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r} "
                             f"{os.environ.get('CUTE_DSL_ARCH')}", 0.0)


def test_compile_processes_see_no_gpu_and_are_told_the_stores_arch(tmp_path):
    """Told the arch, CuTeDSL does not ask the driver for it (with no GPU visible, that stalled
    each of 16 processes started together on the H200 host for over a minute)."""
    pool = CompilePool(ArtifactStore(tmp_path, "sm_100a"), 1, ["testkit.fault_kernel"],
                       handler="test_compile_pool:ReportEnvironment")
    try:
        assert pool.submit(KERNEL, PROBLEM, OK).result(120).failure == "'' sm_100a"
    finally:
        pool.close()


def test_an_artifact_is_found_loaded_and_a_damaged_one_is_dropped(tmp_path):
    store = ArtifactStore(tmp_path, os.environ["CUTE_DSL_ARCH"])
    assert store.find(KERNEL, PROBLEM, OK) is None and store.load(KERNEL, PROBLEM, OK) is None
    path = store.compile(KERNEL, PROBLEM, OK)
    assert path.name.startswith(store.key(KERNEL, PROBLEM, OK)) and path.suffix == ".so"
    assert store.find(KERNEL, PROBLEM, OK) == path
    assert callable(store.load(KERNEL, PROBLEM, OK))
    assert store.key(KERNEL, PROBLEM, OTHER) != store.key(KERNEL, PROBLEM, OK)
    assert ArtifactStore(tmp_path, "sm_100a").find(KERNEL, PROBLEM, OK) is None
    path.write_bytes(path.read_bytes()[:100])  # truncated, e.g. by a full disk
    assert store.find(KERNEL, PROBLEM, OK) is None and not path.exists()
    assert store.counts.unsound == 1
    # No temporary file left behind either: only the point's manifest and the record of the
    # runtime libraries.
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"{store.key(KERNEL, PROBLEM, OK)}.json", RUNTIME_LIBRARIES]


def test_get_loads_a_stored_point_and_otherwise_compiles_and_stores_it(tmp_path):
    store = ArtifactStore(tmp_path, os.environ["CUTE_DSL_ARCH"])
    assert callable(store.get(KERNEL, PROBLEM, OK))
    assert (store.counts.loaded, store.counts.compiled) == (0, 1)
    again = ArtifactStore(tmp_path, store.arch)  # another process
    assert callable(again.get(KERNEL, PROBLEM, OK))
    assert (again.counts.loaded, again.counts.compiled) == (1, 0)
    (entry,) = again.entries()
    assert (entry["kernel"], entry["config"], entry["arch"]) == (
        KERNEL.name, config_to_json(OK), store.arch)
    assert entry["file"].startswith(store.key(KERNEL, PROBLEM, OK)) and entry["bytes"] > 0
    # The artifact, its manifest and the record of the runtime libraries.
    assert clear_artifacts(tmp_path) == 3 and again.entries() == []


def test_a_loaded_artifact_imports_no_cutedsl(tmp_path):
    """A process loading stored points (a warm warmup) pays no CuTeDSL import: the artifact is
    a shared library tvm-ffi loads, its runtime libraries found from the directory's record."""
    ArtifactStore(tmp_path, os.environ["CUTE_DSL_ARCH"]).compile(KERNEL, PROBLEM, OK)
    done = subprocess.run([sys.executable, "-c", f"""
import sys
from pathlib import Path
from testkit.fault_kernel import KERNEL, FaultConfig, FaultProblem
from cutetune.build.artifacts import ArtifactStore
store = ArtifactStore(Path({str(tmp_path)!r}), {os.environ["CUTE_DSL_ARCH"]!r})
loaded = store.load(KERNEL, FaultProblem(num_tokens=1), FaultConfig("ok", 1))
print(callable(loaded), store.counts.unsound, [m for m in sys.modules if m.startswith("cutlass")])
"""], capture_output=True, text=True, check=True,
        env=child_env())
    assert done.stdout.strip().split(maxsplit=2) == ["True", "0", "[]"]


def test_an_artifact_that_does_not_load_is_dropped_and_compiled_again(tmp_path):
    store = ArtifactStore(tmp_path, os.environ["CUTE_DSL_ARCH"])
    path = store.compile(KERNEL, PROBLEM, OK)
    # Sound by its digest, but no library: what another platform's file would look like.
    junk = tmp_path / "junk"
    junk.write_bytes(b"not a shared library")
    foreign = path.with_name(f"{store.key(KERNEL, PROBLEM, OK)}-{content_digest(junk)}.so")
    path.unlink()
    junk.rename(foreign)
    assert callable(store.get(KERNEL, PROBLEM, OK))
    assert (store.counts.unsound, store.counts.compiled) == (1, 2)
    assert not foreign.exists()


def test_an_unwritable_directory_is_reported(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert not ArtifactStore(blocked / "artifacts", "sm_90a").writable()
    assert ArtifactStore(tmp_path / "new", "sm_90a").writable()


def cubin_arch(artifact: Path) -> int:
    """The SM version of the cubin an artifact embeds, from its ELF e_flags: the low byte in
    the ELF ABI of sm_90 cubins, the second byte in that of sm_100 ones (whose low byte is the
    ABI's small version number)."""
    data = artifact.read_bytes()
    flags = struct.unpack_from("<I", data, data.index(b"\x7fELF", 1) + 0x30)[0]
    return flags & 0xFF if flags & 0xFF >= 0x20 else (flags >> 8) & 0xFF


@pytest.mark.parametrize(("arch", "sm"), [("sm_90a", 90), ("sm_100a", 100)])
def test_a_store_compiles_for_its_arch_whatever_the_environment_says(tmp_path, arch, sm):
    assert os.environ["CUTE_DSL_ARCH"] == "sm_90a"  # tests/conftest.py
    assert cubin_arch(ArtifactStore(tmp_path, arch).compile(KERNEL, PROBLEM, OK)) == sm


def test_the_pool_compiles_once_per_point_and_reports_every_failure(tmp_path):
    store = ArtifactStore(tmp_path, os.environ["CUTE_DSL_ARCH"])
    pool = CompilePool(store, 1, ["testkit.fault_kernel"], handler="test_compile_pool:CrashOnSlow")
    try:
        ahead = pool.submit(KERNEL, PROBLEM, OTHER, ahead=True)
        first = pool.submit(KERNEL, PROBLEM, OK)
        assert pool.submit(KERNEL, PROBLEM, OK) is first
        failing = pool.submit(KERNEL, PROBLEM, FaultConfig("compile_error", 1))
        crashing = pool.submit(KERNEL, PROBLEM, FaultConfig("slow", 1))
        assert first.result(120).failure is None and first.result().seconds > 0
        assert ahead.result(120).failure is None
        assert failing.result(120).failure.startswith(
            "compile failed: error: injected compile failure")
        assert crashing.result(120).failure == "crash: SIGSEGV while compiling"
        # After the crash a new compile process serves; a stored point needs none.
        assert pool.submit(KERNEL, PROBLEM, FaultConfig("wrong", 1)).result(120).failure is None
        assert pool.cpu_seconds > 0 and pool.start_seconds > 0
    finally:
        pool.close()
    again = CompilePool(store, 1, ["testkit.fault_kernel"])
    try:
        stored = again.submit(KERNEL, PROBLEM, OK)
        assert stored.done() and stored.result().seconds == 0
    finally:
        again.close()
