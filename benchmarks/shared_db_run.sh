#!/usr/bin/env bash
# A model tuned against a PostgreSQL server on the GPU machine, beside the same run into a
# SQLite file (issue 41 item 6; BENCHMARKS.md, "One model tuned against PostgreSQL"): one
# `cutetune tune --model M` process each, one after the other, sharing the artifact cache. The
# PostgreSQL run is copied out with `cutetune export --format db` (cutetune's tables: winners,
# runs, trials, ceilings), and each run's buckets are written as benchmarks.winner_repro's
# run CSVs: run 1 PostgreSQL, run 2 SQLite.
#
#   benchmarks/shared_db_run.sh POSTGRES_URL OUT_DIR [MODEL] [TOKENS]
#
# POSTGRES_URL is a server of its own for the run (its Optuna studies and cutetune's tables go
# in its default schema); start one as .ci/postgres.sh does. Writes OUT_DIR/MODEL-run1.csv and
# OUT_DIR/MODEL-run2.csv (compare them with `python3 -m benchmarks.winner_repro compare`), and
# each run's summary and log as OUT_DIR/tune-{postgresql,sqlite}.txt.
set -euo pipefail
url=$1 out=$2 model=${3:-qwen3-8b} tokens=${4:-1,64,4096}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export CUTETUNE_CACHE_DIR=$work/cache
cutetune() { python3 -m cutetune.cli.main "$@"; }
cutetune --db "$url" tune --model "$model" --tokens "$tokens" > "$out/tune-postgresql.txt" 2>&1
cutetune --db "sqlite:///$work/sqlite.db" tune --model "$model" --tokens "$tokens" \
    > "$out/tune-sqlite.txt" 2>&1
cutetune --db "$url" export --format db --out "$work/postgresql.db"
python3 -m benchmarks.winner_repro rows "sqlite:///$work/postgresql.db" --model "$model" --run 1 \
    --out "$out/$model-run1.csv"
python3 -m benchmarks.winner_repro rows "sqlite:///$work/sqlite.db" --model "$model" --run 2 \
    --out "$out/$model-run2.csv"
