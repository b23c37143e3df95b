"""benchmarks/fast_path_host.py times what it says: each op's fast path, served do_nothing."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import fast_path_host  # noqa: E402

from cutetune import dispatch  # noqa: E402


def test_every_op_is_timed_on_its_fast_path(monkeypatch, capsys):
    monkeypatch.setattr(fast_path_host, "CALLS", 20)
    monkeypatch.setattr(fast_path_host, "ROUNDS", 1)
    monkeypatch.setattr(dispatch, "_current", None)
    served = []
    monkeypatch.setattr(fast_path_host, "do_nothing", lambda *args: served.append(len(args)))
    fast_path_host.main()
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:]] == [
        "qk_norm", "rmsnorm", "fused_add_rmsnorm", "silu_and_mul", "moe_combine", "t.shape"]
    # Each op's loop and its bare loop called the stand-in for the kernel 20 times apiece.
    assert len(served) == 5 * 2 * 20 + 5


def test_an_op_off_its_fast_path_is_refused(monkeypatch):
    monkeypatch.setattr(dispatch, "_current", None)
    monkeypatch.setattr(fast_path_host, "op_calls", lambda: {
        "nothing": (lambda: None, ())})
    with pytest.raises(SystemExit, match="0 signatures asked for by 1 ops"):
        fast_path_host.main()
