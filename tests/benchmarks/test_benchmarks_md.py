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
    # A data file the index lists (its first, whatever the current data are).
    listed = (results_copy / "index.csv").read_text().splitlines()[1].split(",")[0]
    (results_copy / listed).unlink()
    with pytest.raises(SystemExit, match=f"not there: {listed}"):
        generator.benchmarks_md()


def test_every_section_comes_from_its_data():
    text = generator.benchmarks_md()
    for heading in ("## Method", "## Kernels against the peers",
                    "## Tuned winners of the shipped models", "## Whole-model tuning time",
                    "## The ETA of a whole-model run", "## Winners of fresh runs",
                    "## Warm start", "## Host time per call",
                    "## The Hugging Face drop-in against transformers", "## Targets missed"):
        assert heading in text
    # A number from each kind of file, as the file holds it.
    assert ("| qwen3-8b | 124 | 124 | 12.97 s | 1.624 s | 0.0004 s | **0.321 s** "
            "| 0.344 s | 0.036 s | 0.202 s | 0 / 0 / 0 | 16 |") in text
    assert ("| qwen3_moe | decode batch 64 | 13205 | 12109 | 1.09x | 11221 / 10603 (60) | 11683 "
            "| 11047 | 1.06x | 0.0674 |") in text
    assert "| 51 of 1014 (5%) | 27 s | 235 s | 195 s | +20% | 503 s (+158%) | 221 s |" in text
    # The winners' table is compared from the runs' own CSVs in the listed folder.
    assert "| qwen3-8b | 4 | 30 | **21 (70%)** | 0 | 9 |" in text
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


def bench_row(implementation: str, us: float, kernel: str = "rmsnorm",
              problem: str = '{"hidden": 7}', tokens: int = 4096) -> str:
    quoted = problem.replace('"', '""')
    return (f'H200,{kernel},"{quoted}",{tokens},"{implementation}",{us},0.1,1000,50.0,4000,'
            f'0.5,\n')


def bench_problem_rows(kernel: str, problem: str, tokens: int) -> str:
    """Ours, the copy and one peer for one problem at one token count."""
    return "".join(bench_row(implementation, us, kernel, problem, tokens) for implementation, us
                   in (("cutetune default", 10.0), ("torch eager", 20.0),
                       ("copy, same bytes", 5.0)))


def section_of(text: str, heading: str) -> str:
    """The text of one section, from its heading to the next heading."""
    start = text.index(heading + "\n")
    end = text.find("\n#", start + len(heading))
    return text[start:] if end == -1 else text[start:end]


def test_a_bench_table_states_its_shared_fields_once_and_its_rows_the_varying_ones(
        results_copy):
    wide = '{"dtype": "bfloat16", "hidden": 4096, "eps": 1e-06, "fused_add": false}'
    narrow = '{"dtype": "bfloat16", "hidden": 2048, "eps": 1e-06, "fused_add": true}'
    add_listed_file(results_copy, "bench-two-problems.csv", "bench",
                    BENCH_HEAD + bench_problem_rows("toy_norm", wide, 1)
                    + bench_problem_rows("toy_norm", wide, 8)
                    + bench_problem_rows("toy_norm", narrow, 1),
                    "cutetune bench toy_norm --model M --out F")
    section = section_of(generator.benchmarks_md(), "### toy_norm")
    assert section.count("All rows: dtype bfloat16, eps 1e-06.") == 1
    assert "| problem | tokens | cutetune default | torch eager | copy, same bytes |" in section
    assert "| hidden=4096 fused_add=False | 1 | 10.00 | 20.00 | 5.00 |" in section
    assert "| hidden=4096 fused_add=False | 8 | 10.00 | 20.00 | 5.00 |" in section
    assert "| hidden=2048 fused_add=True | 1 | 10.00 | 20.00 | 5.00 |" in section
    assert "dtype=" not in section and "eps=" not in section


def test_a_bench_table_of_one_problem_has_no_problem_column(results_copy):
    add_listed_file(results_copy, "bench-one-problem.csv", "bench",
                    BENCH_HEAD + bench_problem_rows("toy_norm", '{"hidden": 64}', 1),
                    "cutetune bench toy_norm --model M --out F")
    section = section_of(generator.benchmarks_md(), "### toy_norm")
    assert section.count("All rows: hidden 64.") == 1
    assert "| tokens | cutetune default | torch eager | copy, same bytes |" in section
    assert "| 1 | 10.00 | 20.00 | 5.00 |" in section
    assert "problem" not in section and "hidden=" not in section


def test_a_tuned_table_states_its_shared_fields_once():
    section = section_of(generator.benchmarks_md(), "### qwen3-8b")
    assert section.count("All rows: dtype bfloat16.") == 1
    assert "| silu_and_mul | intermediate=12288 |" in section
    assert ("| rmsnorm | out_dtype=bfloat16 hidden=4096 eps=1e-06 weight_bias=0.0 "
            "fused_add=True |") in section
    assert "dtype=bfloat16 " not in section.replace("out_dtype=bfloat16 ", "")


def test_a_model_tuned_in_two_runs_has_one_heading_and_a_table_per_run(results_copy):
    summary = ("kernel  problem  tokens  status  us  % roof  vs default  trials  failed  winner\n"
               "rope  dtype=bfloat16 head_dim=128  1  tuned  1.50  0.5  1.04x  16  0  "
               "vector_bits=64\ntime: 1m00s wall\n")
    add_listed_file(results_copy, "shipped-qwen3-8b-abc1234.txt", "tuned", summary,
                    "cutetune tune rope --model qwen3-8b")
    text = generator.benchmarks_md()
    assert text.count("### qwen3-8b\n") == 1
    section = section_of(text, "### qwen3-8b")
    assert "`shipped-qwen3-8b-3a94d99.txt`" in section
    assert "`shipped-qwen3-8b-abc1234.txt`" in section
    assert "| rope |  | 1.50 (0.5%) | 1.04-1.04x |" in section


def test_the_peers_sources_are_a_list_of_one_file_a_line():
    section = section_of(generator.benchmarks_md(), "## Kernels against the peers")
    index = generator.read_index()
    files = index.loc[index["kind"] == "bench", "file"]
    bullets = [line for line in section.splitlines() if line.startswith("- `")]
    assert [line.split("`")[1] for line in bullets] == list(files)


def test_a_newer_bench_file_gives_the_current_number_of_what_both_measured(results_copy):
    for name, us in (("bench-old.csv", 11.0), ("bench-new.csv", 22.0)):
        add_listed_file(results_copy, name, "bench",
                        BENCH_HEAD + bench_row("cutetune default", us)
                        + bench_row("copy, same bytes", 5.0) + bench_row("torch eager", 44.0),
                        "cutetune bench rmsnorm --model M --out F")
    text = generator.benchmarks_md()
    # Measured on another GPU than the committed rmsnorm files, the rows are a table of their own.
    assert ("us per call on the H200 (copy ceiling 4000 GB/s).\n\nAll rows: hidden 7.\n\n"
            "| tokens | cutetune default | copy, same bytes | torch eager | ours % of copy ceiling "
            "| ours % of same-bytes copy | ours vs best peer |\n|---|---|---|---|---|---|---|\n"
            "| 4096 | 22.00 | 5.00 | 44.00 | 50.0% | 22.7% | 2.00x |") in text
    assert "11.00" not in text


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
    assert text.index("## Winners of fresh runs") < text.index("## Warm start") < text.index(
        "## Host time per call")


def test_the_eta_table_marks_an_error_beyond_the_target(results_copy):
    """Synthetic numbers (a test input, not a measurement): within 30% plain, beyond it bold."""
    add_listed_file(results_copy, "tune-eta-abc1234.csv", "tune_eta",
                    "model,tokens,share_pct,trials_done,trials_planned,elapsed_s,eta_s,"
                    "true_remaining_s,eta_error_pct,mean_rate_eta_s,mean_rate_error_pct,run_s\n"
                    "m,\"1,8\",5,10,200,4.0,110.0,100.0,10.0,150.0,50.0,104.0\n"
                    "m,\"1,8\",25,50,200,20.0,40.0,84.0,-52.4,60.0,-28.6,104.0\n",
                    "python3 -m benchmarks.tune_eta --model m --out F")
    text = generator.benchmarks_md()
    assert ("| m | 1,8 | 10 of 200 (5%) | 4 s | 110 s | 100 s | +10% | 150 s (+50%) | 104 s |"
            in text)
    assert ("| m | 1,8 | 50 of 200 (25%) | 20 s | 40 s | 84 s | **-52%** | 60 s (-29%) | 104 s |"
            in text)
