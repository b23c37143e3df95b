"""benchmarks/study_asks.py: the tuner's search over a model's real plans, a stand-in runner
answering with the predicted times; every ask the study holds is counted, the measured ones
among them."""

from benchmarks.study_asks import count_asks


def test_each_bucket_counts_its_measured_trials_among_its_asks(tmp_path):
    rows = count_asks("qwen3-0.6b", ["rmsnorm", "qk_norm"], [64], 8, tmp_path)
    assert [r.kernel for r in rows] == ["rmsnorm", "qk_norm"]
    for row in rows:
        assert row.measured == min(8, row.candidates)
        assert row.asks >= row.measured
        assert row.exhaustive == (row.candidates <= 8)
    # rmsnorm's search asks beyond its trials: TPE proposed pruned or repeated points too.
    assert rows[0].asks > rows[0].measured
