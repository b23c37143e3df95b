"""`cutetune bench` end to end on the GPU, for every registered kernel: every candidate that
runs agrees with the reference and is timed, the rows land in the DB, and the CLI writes its CSV.
"""

from __future__ import annotations

import csv

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select

from cutetune.bench import DEFAULT_NAME, TUNED_NAME, UNFUSED_NAME, run_bench
from cutetune.cli.main import cli
from cutetune.device.measure import INTERLEAVED_ROUNDS
from cutetune.device.specs import DEVICE_SPECS
from cutetune.kernels.registry import get_kernel, kernel_names
from cutetune.results_db import Database, DeviceFingerprint, shipped_winners
from cutetune.results_db.schema import BenchRow
from testkit.model_problems import preset_problems

pytestmark = pytest.mark.gpu


H200 = DEVICE_SPECS["H200"]


def cheapest_problem(kernel):
    """The problem of the presets (the committed configs where no preset applies) that moves
    the fewest bytes at TOKENS: a peer's first call (Triton's autotuning, torch.compile) costs
    time by the size of what it is given, and DeepSeek-V3's MoE combine took five minutes
    here."""
    return min(preset_problems(kernel),
               key=lambda problem: _bytes_moved(kernel, problem.with_tokens(TOKENS)))


def _bytes_moved(kernel, problem) -> int:
    return kernel.cost(problem, kernel.default_config(problem, H200), H200).bytes_moved


# One token count a kernel: each count costs a torch.compile of the reference and the peers'
# first calls (liger's Triton kernels autotune over tens of configs per shape), which made
# this test take minutes. The loop over token counts is the same for every kernel: the CLI
# test below checks it, on qk_norm, with two counts.
TOKENS = 300


@pytest.mark.parametrize("name", kernel_names())
def test_bench_times_every_candidate_and_stores_the_rows(tmp_path, name):
    kernel = get_kernel(name)
    db = Database.open(f"sqlite:///{tmp_path / 'bench.db'}")
    seen = []
    problem = cheapest_problem(kernel)
    run = run_bench(kernel, [problem], (TOKENS,), db, seen.append)
    assert len(seen) == 1 and run.copy_gbps > 1000 and run.empty_kernel_us > 0
    rows = {r.implementation: r for r in run.rows}
    assert {r.problem.num_tokens for r in run.rows} == {TOKENS}
    # An empty DB: only the winners shipped with cutetune (every bucket of a shipped model's
    # problems) serve the tuned row.
    shipped = {(w.kernel_name, w.static_key)
               for w in shipped_winners(DeviceFingerprint.current())
               if w.source_hash == kernel.source_hash()}
    if (name, problem.static_key()) in shipped:
        assert rows[TUNED_NAME].median_us > 0
        assert rows[TUNED_NAME].note.endswith("(shipped with cutetune)")
    else:
        assert rows[TUNED_NAME].median_us is None
    for implementation in (DEFAULT_NAME, "torch eager", "torch.compile"):
        assert rows[implementation].median_us > 0
    # The peer libraries ship to the GPU machine: a peer may sit out only a problem whose
    # math it does not compute; never for a missing library or a disagreement.
    for peer in kernel.peers:
        row = rows[peer.name]
        assert row.median_us is not None or (
            row.note.startswith("not run:") and "not installed" not in row.note), row.note
    # A fused kernel's unfused chain of our kernels is ours: it runs and agrees, or bench
    # raises.
    if kernel.unfused:
        (chain,) = [r for r in run.rows if r.implementation.startswith(UNFUSED_NAME)]
        assert chain.median_us > 0, chain.note
    timed = sum(1 for r in run.rows if r.median_us is not None)
    with db.session() as session:
        assert session.scalar(select(func.count()).select_from(BenchRow)) == timed


def test_bench_cli_prints_the_table_and_writes_the_csv(tmp_path):
    out = tmp_path / "bench.csv"
    result = CliRunner().invoke(cli, ["--db", f"sqlite:///{tmp_path / 'cli.db'}", "bench",
                                      "qk_norm", "--model", "qwen3-8b", "--tokens", "1,8",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "cutetune vs best peer" in result.output and "copy ceiling" in result.output
    # Progress on stderr before each candidate: a peer's first call may autotune for minutes.
    assert "tokens=8: checking liger rms_norm x2 ..." in result.output
    with open(out) as handle:
        rows = list(csv.DictReader(handle))
    # Every token count asked for is benched and written.
    assert {r["tokens"] for r in rows} == {"1", "8"}
    assert {r["implementation"] for r in rows} >= {TUNED_NAME, DEFAULT_NAME, "torch eager",
                                                   "quack rmsnorm x2", "liger rms_norm x2"}
    timed = {r["implementation"] for r in rows if r["us"] and r["tokens"] == "8"}
    assert (f"tokens=8: timing {len(timed) - 1} candidates in {INTERLEAVED_ROUNDS} interleaved "
            "rounds ...") in result.output  # all but the copy ceiling
