#!/usr/bin/env bash
# Tune kernels into one database and bench each against it, kernel by kernel, so that a device
# call that ends early leaves whole kernels done; resumable across calls. Each UNIT is
# KERNEL:TUNE_MODELS[:BENCH_MODELS], the models comma-separated (presets or config.json paths):
# the kernel is tuned for each of TUNE_MODELS at $TOKENS, then benched on each of BENCH_MODELS
# at $TOKENS; after all the units, FULL=1 tunes every pair again at every bucket (the buckets
# tuned already are skipped).
#
#   [DEADLINE_S=540] [TOKENS=1,8,...] [FULL=1] benchmarks/tune_and_bench.sh OUT_DIR UNIT ...
#
# Writes OUT_DIR/tuned.db, tune-MODEL-KERNEL.txt (full-MODEL-KERNEL.txt for FULL), and
# bench-MODEL-KERNEL.csv with its .log; OUT_DIR/done.txt lists the finished steps, which the
# same command skips, so it continues where a call stopped (bring OUT_DIR back and pass it
# again). A step starts only with 40 s (a bench 60 s) of DEADLINE_S left and is stopped with
# Ctrl-C 20 s before it; a stopped tune continues from its stored trials.
set -uo pipefail
out=$1
shift
mkdir -p "$out"
touch "$out/done.txt"
deadline=$(( $(date +%s) + ${DEADLINE_S:-1000000000} ))
tokens=${TOKENS:-1,8,64,512,4096,32768}
cli=(python3 -m cutetune.cli.main --db "sqlite:///$(realpath "$out")/tuned.db")

# step NAME LOG MIN_SECONDS COMMAND...: run COMMAND (output to OUT_DIR/LOG) unless NAME is done;
# fails when less than MIN_SECONDS are left.
step() {
    local name=$1 log=$2 need=$3 left
    shift 3
    grep -qxF "$name" "$out/done.txt" && return 0
    left=$(( deadline - $(date +%s) ))
    if (( left < need )); then
        echo "$(date +%T) stopped for time before $name (${left} s left)"
        return 1
    fi
    echo "$(date +%T) $name"
    if timeout -s INT -k 15 $(( left - 20 )) "$@" > "$out/$log" 2>&1; then
        echo "$name" >> "$out/done.txt"
    else
        echo "$(date +%T) $name failed or was stopped: see $log"
    fi
}

tag() { basename "$1" .json; }  # a preset's name, or a config file's

for unit in "$@"; do
    IFS=: read -r kernel tune_models bench_models <<< "$unit"
    for model in ${tune_models//,/ }; do
        name=tune-$(tag "$model")-$kernel
        step "$name" "$name.txt" 40 \
            "${cli[@]}" tune "$kernel" --model "$model" --tokens "$tokens" || exit 0
    done
    for model in ${bench_models//,/ }; do
        name=bench-$(tag "$model")-$kernel
        step "$name" "$name.log" 60 "${cli[@]}" bench "$kernel" --model "$model" \
            --tokens "$tokens" --out "$out/$name.csv" || exit 0
    done
done
if [ -n "${FULL:-}" ]; then
    for unit in "$@"; do
        IFS=: read -r kernel tune_models _ <<< "$unit"
        for model in ${tune_models//,/ }; do
            name=full-$(tag "$model")-$kernel
            step "$name" "$name.txt" 40 "${cli[@]}" tune "$kernel" --model "$model" || exit 0
        done
    done
fi
echo "$(date +%T) done: $(wc -l < "$out/done.txt") steps"
