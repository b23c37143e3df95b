#!/usr/bin/env bash
# Whole-model tuning time on this GPU (BENCHMARKS.md, "Whole-model tuning"): `cutetune tune`
# of every kernel MODEL uses, default buckets and trial budget, into a fresh database with a
# cold artifact cache; then the same command again, with everything stored.
#
#   benchmarks/whole_model_tune.sh MODEL OUT_DIR
#
# Writes OUT_DIR/MODEL.db, MODEL-first.txt and MODEL-again.txt (each run's summary table and
# time split, then its stderr), and prints each run's whole-process wall time.
set -euo pipefail
model=$1
out=$2
mkdir -p "$out"
rm -f "$out/$model.db"
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
for run in first again; do
    start=$(date +%s.%N)
    CUTETUNE_CACHE_DIR="$cache" python3 -m cutetune.cli.main --db "sqlite:///$out/$model.db" \
        tune --model "$model" > "$out/$model-$run.txt" 2> "$out/$model-$run.err"
    end=$(date +%s.%N)
    cat "$out/$model-$run.err" >> "$out/$model-$run.txt" && rm "$out/$model-$run.err"
    python3 -c "print(f'$model $run run: {$end - $start:.1f} s wall')"
done
