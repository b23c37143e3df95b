"""A database as cutetune's first release wrote it (revision 0001, before cutetune versioned its
tables): the committed DDL of tests/data/results_db_0001/ for the URL's backend, and rows as
that release wrote them, for the tests of the migrations."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import create_engine

FIRST_RELEASE = Path(__file__).parents[1] / "tests" / "data" / "results_db_0001"

# Rows as the first release wrote them (ids from the tables' own sequences, 1 in new tables): a
# device, a kernel, a problem, a run with two trials, its winner and a ceiling.
ROWS = """
INSERT INTO devices (gpu_name, compute_capability, sm_count, driver, cuda, torch, cutlass_dsl)
    VALUES ('NVIDIA H200', '9.0', 132, '570.133', '12.8', '2.9.0', '4.8.1');
INSERT INTO kernels (name, source_hash) VALUES ('qk_norm', '5f1e0c');
INSERT INTO problems (kernel_name, static_key) VALUES ('qk_norm', '{"head_dim": 128}');
INSERT INTO tuning_runs (kernel_id, problem_id, device_id, bucket, num_tokens, study_name,
    started_at, finished_at) VALUES (1, 1, 1, 16, 16, 'qk_norm-16', '2026-01-05 12:00:00',
    '2026-01-05 12:03:00');
INSERT INTO tuning_trials (run_id, number, config_json, status, failure_reason, median_us,
    iqr_us, repeats, gbps, pct_roofline, predicted_us) VALUES
    (1, 0, '{"warps_per_block": 4}', 'ok', NULL, 2.0, 0.04, 100, 2000.0, 47.5, 1.8),
    (1, 1, '{"warps_per_block": 32}', 'failed', 'wrong result', NULL, NULL, NULL, NULL, NULL,
     NULL);
INSERT INTO winners (kernel_id, problem_id, device_id, bucket, config_json, median_us, iqr_us,
    gbps, pct_roofline, trial_id, run_id, updated_at) VALUES (1, 1, 1, 16,
    '{"warps_per_block": 4}', 2.0, 0.04, 2000.0, 47.5, 1, 1, '2026-01-05 12:03:00');
INSERT INTO ceilings (device_id, name, value, measured_at) VALUES
    (1, 'copy_gbps', 4200.0, '2026-01-05 11:00:00');
"""


def run_script(url: str, script: str) -> None:
    """Run `script`'s statements (split at semicolons) in one transaction."""
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            for statement in script.split(";"):
                if statement.strip() and not statement.strip().startswith("--"):
                    connection.exec_driver_sql(statement)
    finally:
        engine.dispose()


def first_release_database(url: str) -> None:
    backend = url.split(":")[0].split("+")[0]
    ddl = "\n".join(line for line in (FIRST_RELEASE / f"{backend}.sql").read_text().splitlines()
                    if not line.startswith("--"))
    run_script(url, ddl + ROWS)
