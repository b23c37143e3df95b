"""The tables of cutetune's first release: devices, kernels, problems, ceilings, runs, trials,
winners and bench results.

Revision ID: 0001
Revises: (none)
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "devices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("gpu_name", sa.String(), nullable=False),
        sa.Column("compute_capability", sa.String(), nullable=False),
        sa.Column("sm_count", sa.Integer(), nullable=False),
        sa.Column("driver", sa.String(), nullable=False),
        sa.Column("cuda", sa.String(), nullable=False),
        sa.Column("torch", sa.String(), nullable=False),
        sa.Column("cutlass_dsl", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint(
            "gpu_name", "compute_capability", "sm_count", "driver", "cuda", "torch", "cutlass_dsl"
        ),
    )
    op.create_table(
        "kernels",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("source_hash", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name", "source_hash"),
    )
    op.create_table(
        "problems",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kernel_name", sa.String(), nullable=False),
        sa.Column("static_key", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("kernel_name", "static_key"),
    )
    op.create_table(
        "bench_results",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("kernel_name", sa.String(), nullable=False),
        sa.Column("static_key", sa.Text(), nullable=False),
        sa.Column("num_tokens", sa.Integer(), nullable=False),
        sa.Column("implementation", sa.String(), nullable=False),
        sa.Column("median_us", sa.Double(), nullable=False),
        sa.Column("gbps", sa.Double(), nullable=False),
        sa.Column("pct_of_copy", sa.Double(), nullable=True),
        sa.Column("measured_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_bench_results_device_id", "bench_results", ["device_id"], unique=False)
    op.create_table(
        "ceilings",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("value", sa.Double(), nullable=False),
        sa.Column("measured_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_ceilings_device_id", "ceilings", ["device_id"], unique=False)
    op.create_table(
        "tuning_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kernel_id", sa.Integer(), nullable=False),
        sa.Column("problem_id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("bucket", sa.Integer(), nullable=False),
        sa.Column("num_tokens", sa.Integer(), nullable=False),
        sa.Column("study_name", sa.String(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"]),
        sa.ForeignKeyConstraint(["kernel_id"], ["kernels.id"]),
        sa.ForeignKeyConstraint(["problem_id"], ["problems.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "tuning_trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("config_json", sa.Text(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("failure_reason", sa.Text(), nullable=True),
        sa.Column("median_us", sa.Double(), nullable=True),
        sa.Column("iqr_us", sa.Double(), nullable=True),
        sa.Column("repeats", sa.Integer(), nullable=True),
        sa.Column("gbps", sa.Double(), nullable=True),
        sa.Column("pct_roofline", sa.Double(), nullable=True),
        sa.Column("predicted_us", sa.Double(), nullable=True),
        sa.CheckConstraint("status IN ('ok', 'failed')", name="status"),
        sa.ForeignKeyConstraint(["run_id"], ["tuning_runs.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_id", "number"),
    )
    op.create_index("ix_tuning_trials_run_id", "tuning_trials", ["run_id"], unique=False)
    op.create_table(
        "winners",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kernel_id", sa.Integer(), nullable=False),
        sa.Column("problem_id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("bucket", sa.Integer(), nullable=False),
        sa.Column("config_json", sa.Text(), nullable=False),
        sa.Column("median_us", sa.Double(), nullable=False),
        sa.Column("iqr_us", sa.Double(), nullable=True),
        sa.Column("gbps", sa.Double(), nullable=True),
        sa.Column("pct_roofline", sa.Double(), nullable=True),
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"]),
        sa.ForeignKeyConstraint(["kernel_id"], ["kernels.id"]),
        sa.ForeignKeyConstraint(["problem_id"], ["problems.id"]),
        sa.ForeignKeyConstraint(["run_id"], ["tuning_runs.id"]),
        sa.ForeignKeyConstraint(["trial_id"], ["tuning_trials.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("kernel_id", "problem_id", "device_id", "bucket"),
    )
