#!/usr/bin/env bash
# Tune, then bench, each KERNEL:MODEL pair in turn on the visible GPU; every log, the tuned DB
# and the bench CSVs go to OUTDIR (benchmarks/bench_presets.sh writes the ones BENCHMARKS.md is
# generated from).
#   benchmarks/tune_and_bench.sh OUTDIR TRIALS KERNEL:MODEL ...
set -uo pipefail
out=$1 trials=$2
shift 2
mkdir -p "$out"
cli=(python3 -m cutetune.cli.main --db "sqlite:///$out/tuned.db")
# TOKENS="1,8,64" limits the buckets tuned and benched (default: every bucket).
tokens=(${TOKENS:+--tokens "$TOKENS"})
for pair in "$@"; do
    kernel=${pair%%:*} model=${pair#*:}
    tag=$kernel-$(basename "$(dirname "$model/x")")
    echo "$(date +%T) tune $pair"
    "${cli[@]}" tune "$kernel" --model "$model" --trials "$trials" "${tokens[@]}" > "$out/tune-$tag.log" 2>&1 ||
        echo "tune $pair failed: see tune-$tag.log"
    echo "$(date +%T) bench $pair"
    "${cli[@]}" bench "$kernel" --model "$model" "${tokens[@]}" --out "$out/bench-$tag.csv" \
        > "$out/bench-$tag.log" 2>&1 || echo "bench $pair failed: see bench-$tag.log"
done
echo "$(date +%T) done"
