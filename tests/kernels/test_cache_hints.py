"""cache_hints' register-fragment copies (load_into, store_from), compiled for sm_90a on the CPU:
normal and streaming hints compile to plain and .cs accesses, and any other hint is refused
while tracing rather than silently copied plainly."""

import cutlass
import cutlass.cute as cute
import pytest

from cutetune.kernels.device import cache_hints


@cute.kernel
def _copy_vector(mSrc: cute.Tensor, mDst: cute.Tensor, HINTS: cutlass.Constexpr[str]):
    gSrc = cute.zipped_divide(mSrc, (8,))
    gDst = cute.zipped_divide(mDst, (8,))
    fragment = cute.make_rmem_tensor(cute.make_layout((1, 8)), mSrc.element_type)
    cache_hints.load_into(gSrc[(None, 0)], fragment, HINTS)
    cache_hints.store_from(fragment, gDst[(None, 0)], HINTS)


@cute.jit
def _launch(mSrc: cute.Tensor, mDst: cute.Tensor, HINTS: cutlass.Constexpr[str]):
    _copy_vector(mSrc, mDst, HINTS).launch(grid=(1, 1, 1), block=(32, 1, 1))


def _ptx(hints: str, tmp_path, monkeypatch) -> str:
    monkeypatch.chdir(tmp_path)
    fake = [cute.runtime.make_fake_tensor(cutlass.BFloat16, (8,), (1,), assumed_align=16)
            for _ in range(2)]
    cute.compile(_launch, *fake, hints, options=f"--keep-ptx --dump-dir {tmp_path}")
    (ptx_file,) = tmp_path.glob("*.ptx")
    return ptx_file.read_text()


def test_normal_and_streaming_fragments_compile_to_their_accesses(tmp_path, monkeypatch):
    (tmp_path / "n").mkdir()
    (tmp_path / "s").mkdir()
    normal = _ptx(cache_hints.NORMAL, tmp_path / "n", monkeypatch)
    streaming = _ptx(cache_hints.STREAMING, tmp_path / "s", monkeypatch)
    assert "ld.global.v4.b32" in normal and "st.global.v4.b32" in normal
    assert ".cs." not in normal
    assert "ld.global.cs.v4.b32" in streaming and "st.global.cs.v4.b32" in streaming


def test_other_hints_are_refused_while_tracing(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="not 'evict_last_loads'"):
        _ptx(cache_hints.EVICT_LAST_LOADS, tmp_path, monkeypatch)
