#!/usr/bin/env bash
# The same benchmarks of two source trees of cutetune (say, before and after a refactor) on one
# GPU, in one run: `cutetune bench` of one preset per kernel, each pair run by the two trees back
# to back, then the ops' host time (op_host_overhead.py) of each tree. Each tree runs with its
# own artifact cache, so neither serves the other's binaries.
#
#   benchmarks/compare_trees.sh OLD_TREE NEW_TREE OUT_DIR [TOKENS [KERNEL:MODEL ...]]
#
# Writes OUT_DIR/compare.tgz: OLD/NEW-named bench CSVs and logs, and host-overhead CSVs.
set -uo pipefail
old=$(cd "$1" && pwd) new=$(cd "$2" && pwd) out=$3 tokens=${4:-1,64,4096}
shift $(( $# < 4 ? $# : 4 ))
pairs=("$@")
if [ ${#pairs[@]} -eq 0 ]; then
    pairs=(qk_norm:qwen3-8b rmsnorm:qwen3-8b silu_and_mul:qwen3-8b
           moe_dispatch:qwen3-30b-a3b moe_combine:qwen3-30b-a3b
           gelu_and_mul:benchmarks/models/gemma-2-2b/config.json)
fi
work=$(mktemp -d)
run_in() {  # run_in TREE NAME COMMAND...: the command in TREE, its own cache, cutetune from TREE
    local tree=$1 name=$2
    shift 2
    (cd "$tree" && CUTETUNE_CACHE_DIR="$work/cache-$name" PYTHONPATH="$tree:${PYTHONPATH:-}" "$@")
}
for pair in "${pairs[@]}"; do
    kernel=${pair%%:*} model=${pair#*:}
    for side in old new; do
        tree=${!side}
        echo "$(date +%T) $side bench $kernel $model"
        run_in "$tree" "$side" python3 -m cutetune.cli.main bench "$kernel" --model "$model" \
            --tokens "$tokens" --out "$work/bench-$side-$kernel.csv" \
            > "$work/bench-$side-$kernel.log" 2>&1 || echo "  failed: see bench-$side-$kernel.log"
    done
done
for side in old new; do
    echo "$(date +%T) $side host overhead"
    run_in "${!side}" "$side" python3 -m benchmarks.op_host_overhead qwen3-30b-a3b \
        --out "$work/host-$side.csv" > "$work/host-$side.log" 2>&1 || echo "  failed"
done
mkdir -p "$out"
tar -czf "$out/compare.tgz" -C "$work" --exclude='cache-*' .
echo "$(date +%T) done"
