"""BENCHMARKS.md is generated from the committed measurements (benchmarks/benchmarks_md.py):
it must be what the data gives, and the data must say where each file came from."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from benchmarks import benchmarks_md as generator


def test_benchmarks_md_is_what_the_committed_data_gives():
    assert generator.OUT.read_text() == generator.benchmarks_md(), (
        "BENCHMARKS.md is stale: run python3 -m benchmarks.benchmarks_md")


@pytest.fixture
def results_copy(tmp_path, monkeypatch) -> Path:
    copy = tmp_path / "results"
    shutil.copytree(generator.RESULTS, copy)
    monkeypatch.setattr(generator, "RESULTS", copy)
    return copy


def test_a_data_file_the_index_does_not_list_is_refused(results_copy):
    (results_copy / "bench-mystery.csv").write_text("gpu,kernel\n")
    with pytest.raises(SystemExit, match="does not list: bench-mystery.csv"):
        generator.benchmarks_md()


def test_a_listed_file_that_is_missing_is_refused(results_copy):
    (results_copy / "warmup-0c0d6b2.csv").unlink()
    with pytest.raises(SystemExit, match="not there: warmup-0c0d6b2.csv"):
        generator.benchmarks_md()


def test_every_section_comes_from_its_data():
    text = generator.benchmarks_md()
    for heading in ("## Method", "## Kernels against the peers",
                    "## Tuned winners of the shipped models", "## Whole-model tuning time",
                    "## Warmup time", "## Host time per call", "## A Hugging Face model's step",
                    "## Targets missed"):
        assert heading in text
    # A number from each kind of file, as the file holds it.
    assert "| qwen3-8b | 60 | 16.74 s | **0.864 s** | 0 | 16 |" in text
    assert ("| prefill 4096 tokens | 8588 | 6619 | 4717 | - | 3474 | 6477 | - | 308.5 us (8.9%) |"
            in text)
    assert "| moe_dispatch into buffers | 10.88 us | 12.38 us | **1.50 us** | 2.32 us |" in text
    assert "555.04 (104.8%)" in text


def add_listed_file(results: Path, name: str, kind: str, text: str, command: str) -> None:
    """A data file in the results copy, and its row in the index."""
    (results / name).write_text(text)
    with (results / "index.csv").open("a") as index:
        index.write(f"{name},{kind},abc1234,2026-12-02,one H200,{command}\n")


def test_the_host_steps_table_comes_from_a_listed_units_file(results_copy):
    add_listed_file(results_copy, "host-units-qwen3-8b-abc1234.csv", "host_units",
                    "model,step,us\nqwen3-8b,a view (t[:]),2.9\n",
                    "python3 -m benchmarks.op_host_overhead qwen3-8b --units F")
    text = generator.benchmarks_md()
    assert "### The single host steps" in text
    assert "| qwen3-8b | a view (t[:]) | 2.90 |" in text
    assert text.index("## Host time per call") < text.index("### The single host steps")


BENCH_HEAD = ("gpu,kernel,problem,tokens,implementation,us,iqr_us,gbps,pct_of_copy,copy_gbps,"
              "empty_kernel_us,note\n")


def bench_row(implementation: str, us: float) -> str:
    return (f'H200,rmsnorm,"{{""hidden"": 7}}",4096,"{implementation}",{us},0.1,1000,50.0,4000,'
            f'0.5,\n')


def test_a_newer_bench_file_gives_the_current_number_of_what_both_measured(results_copy):
    for name, us in (("bench-old.csv", 11.0), ("bench-new.csv", 22.0)):
        add_listed_file(results_copy, name, "bench",
                        BENCH_HEAD + bench_row("cutetune default", us)
                        + bench_row("copy, same bytes", 5.0) + bench_row("torch eager", 44.0),
                        "cutetune bench rmsnorm --model M --out F")
    text = generator.benchmarks_md()
    # The peers of the committed rmsnorm files have no row here: "-".
    assert ("| hidden=7 | 4096 | - | 22.00 | 44.00 | - | - | - | 5.00 | 50.0% | 22.7% | 2.00x |"
            in text)
    assert "11.00" not in text


def test_the_hf_step_table_shows_cutetunes_share_where_the_file_has_it(results_copy):
    add_listed_file(results_copy, "hf-step-abc1234.csv", "hf_step",
                    "case,model,median us,IQR us,note\n"
                    "decode batch 1,\"unpatched, eager\",5000.0,10.0,\n"
                    "decode batch 1,\"cutetune, CUDA graph\",370.0,2.0,\n"
                    "decode batch 1,\"cutetune, kernels' device time\",360.0,,"
                    "cutetune's kernels 21.0 us (5.8%)\n",
                    "python3 -m benchmarks.hf_decode_step --layers 2 --out F")
    text = generator.benchmarks_md()
    assert ("| case | unpatched, eager | cutetune, CUDA graph | cutetune, kernels' device time "
            "| cutetune's kernels (share) |") in text
    assert "| decode batch 1 | 5000 | 370 | 360 | 21.0 us (5.8%) |" in text


def test_the_host_time_table_shows_the_unlaunched_cost(results_copy):
    add_listed_file(results_copy, "host-overhead-qwen3-8b-abc1234.csv", "host_overhead",
                    "model,op,problem,bare_us,op_us,added_us,added_unlaunched_us\n"
                    "qwen3-8b,rmsnorm,P,6.0,7.9,1.9,0.75\n",
                    "python3 -m benchmarks.op_host_overhead qwen3-8b --out F")
    text = generator.benchmarks_md()
    assert "| model | op | bare call | op | added | added, no launch |" in text
    assert "| qwen3-8b | rmsnorm | 6.00 us | 7.90 us | **1.90 us** | 0.75 us |" in text


HF_DROP_IN_HEAD = ("family,dims,layers,vocab,transformers,unpatched_runs,case,batch,seq_len,mode,"
                   "unpatched_us,unpatched_iqr_us,patched_us,patched_iqr_us,speedup,"
                   "max_logit_diff,unpatched_device_us,patched_device_us,cutetune_device_us,"
                   "note\n")


def test_the_hf_drop_in_table_sets_eager_and_graph_side_by_side_and_marks_misses(results_copy):
    """Synthetic numbers (a test input, not a measurement): a miss in bold, a side that
    could not be captured as '-' with its reason below the table."""
    model = "qwen3_moe,Qwen/Qwen3-Coder-480B-A35B-Instruct,2,4096,5.17.0"
    runs = '"attention sdpa, experts grouped_mm"'
    add_listed_file(
        results_copy, "hf-drop-in-abc1234.csv", "hf_drop_in",
        HF_DROP_IN_HEAD
        + f"{model},{runs},decode batch 1,1,1,eager,5000.0,10.0,5200.0,20.0,0.9615,0.0156,"
          "460.0,300.0,25.0,\n"
        + f"{model},{runs},decode batch 1,1,1,CUDA graph,500.0,1.0,400.0,2.0,1.25,0.0156,"
          "nan,nan,nan,\n"
        + f"{model},{runs},prefill 2048 tokens,1,2048,eager,9000.0,10.0,6000.0,20.0,1.5,"
          "0.0312,7000.0,4000.0,300.0,\n"
        + f"{model},{runs},prefill 2048 tokens,1,2048,CUDA graph,nan,nan,5000.0,2.0,nan,"
          "0.0312,nan,nan,nan,unpatched not capturable: RuntimeError: no\n",
        "python3 -m benchmarks.hf_decode_step --out F")
    text = generator.benchmarks_md()
    assert "## The Hugging Face drop-in against transformers" in text
    assert ("- qwen3_moe: Qwen/Qwen3-Coder-480B-A35B-Instruct (attention sdpa, experts "
            "grouped_mm)") in text
    assert ("| qwen3_moe | decode batch 1 | 5000 | 5200 | **0.96x** | 460 / 300 (25) | 500 | "
            "400 | 1.25x | 0.0156 |") in text
    assert ("| qwen3_moe | prefill 2048 tokens | 9000 | 6000 | 1.50x | 7000 / 4000 (300) | - "
            "| 5000 | - | 0.0312 |") in text
    assert ("- qwen3_moe, prefill 2048 tokens, CUDA graph: unpatched not capturable: "
            "RuntimeError: no") in text


WARM_START_HEAD = ("model,winners,points,loaded,cache_artifacts,cold_s,torch_import_s,"
                   "cutetune_import_s,warmup_s,warmup_max_s,first_op_s,cuda_init_s,"
                   "cutedsl_modules,optuna_modules,sqlalchemy_modules,starts,cpus,host_only\n")


def test_the_warm_start_table_comes_from_a_listed_file_and_shows_cuda_where_measured(
        results_copy):
    """Synthetic numbers (a test input, not a measurement); without a GPU (--host-only) CUDA's
    time is not measured: '-'."""
    add_listed_file(results_copy, "warm-start-abc1234.csv", "warm_start",
                    WARM_START_HEAD
                    + "qwen3-8b,80,74,74,74,16.5,2.1,0.0008,0.61,0.66,0.05,0.35,0,0,0,3,16,False\n"
                    + "deepseek-v3,96,90,90,90,17.0,2.2,0.0007,0.58,0.6,0.05,,0,0,0,3,16,True\n",
                    "python3 -m benchmarks.warmup_time --out F")
    text = generator.benchmarks_md()
    assert "## Warm start" in text
    assert ("| qwen3-8b | 74 | 74 | 16.5 s | 2.1 s | 0.0008 s | **0.61 s** | 0.66 s | 0.05 s "
            "| 0.35 s | 0 / 0 / 0 | 16 |") in text
    assert ("| deepseek-v3 | 90 | 90 | 17.0 s | 2.2 s | 0.0007 s | **0.58 s** | 0.6 s | 0.05 s "
            "| - |") in text
    assert text.index("## Warmup time") < text.index("## Warm start") < text.index(
        "## Host time per call")
