#!/usr/bin/env bash
# The bench data BENCHMARKS.md is generated from: `cutetune bench` of every kernel on the preset
# models it serves (served by the shipped winners where cutetune ships them; the heuristic
# default elsewhere), at six token counts from decode to prefill, beside torch and the peers.
#
#   benchmarks/bench_presets.sh OUT_DIR COMMIT DATE [KERNEL:MODEL ...]
#
# Writes OUT_DIR/bench-MODEL-KERNEL-COMMIT.csv per pair (its log beside it) and
# OUT_DIR/index-rows.csv, the rows to add to benchmarks/results/index.csv with the files.
# COMMIT and DATE name the code measured (the device machine's copy of the tree has no git).
set -uo pipefail
out=$1 commit=$2 date=$3
shift 3
pairs=("$@")
if [ ${#pairs[@]} -eq 0 ]; then
    pairs=(qk_norm:qwen3-8b rmsnorm:qwen3-8b silu_and_mul:qwen3-8b
           rmsnorm:llama-3.1-8b silu_and_mul:llama-3.1-8b
           qk_norm:qwen3-30b-a3b moe_dispatch:qwen3-30b-a3b moe_combine:qwen3-30b-a3b
           moe_dispatch:deepseek-v3 moe_combine:deepseek-v3
           fp8_group_quant:deepseek-v3 rmsnorm_fp8_quant:deepseek-v3
           silu_and_mul_fp8_quant:deepseek-v3 moe_dispatch_fp8_quant:deepseek-v3
           nvfp4_quant:llama-3.1-8b-fp4 mxfp8_quant:tests/data/hf_configs/Qwen3-8B-MXFP8.json
           rope:qwen3-8b rope:deepseek-v3 qk_norm_rope:qwen3-8b qk_norm_rope_kv:qwen3-8b
           embedding:qwen3-8b embedding_rmsnorm:qwen3-8b
           gelu_and_mul:benchmarks/models/gemma-2-2b/config.json)
fi
# The token counts of every table in BENCHMARKS.md (bench's default is every bucket).
tokens=1,8,64,512,4096,32768
mkdir -p "$out"
machine=$(python3 -c "import torch; print(torch.cuda.get_device_name())")
for pair in "${pairs[@]}"; do
    kernel=${pair%%:*} model=${pair#*:}
    name=$(basename "$(dirname "$model/x")")
    [ "$name" = config.json ] && name=$(basename "$(dirname "$model")")
    name=${name%.json}
    file=bench-$name-$kernel-$commit.csv
    echo "$(date +%T) bench $kernel $model"
    if python3 -m cutetune.cli.main bench "$kernel" --model "$model" --tokens "$tokens" \
        --out "$out/$file" > "$out/${file%.csv}.log" 2>&1; then
        echo "$file,bench,$commit,$date,\"one $machine\",\"cutetune bench $kernel --model $model" \
            "--tokens $tokens --out F\"" >> "$out/index-rows.csv"
    else
        echo "bench $pair failed: see ${file%.csv}.log"
    fi
done
echo "$(date +%T) done"
