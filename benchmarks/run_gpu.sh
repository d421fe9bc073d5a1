#!/usr/bin/env bash
# Reproduce the README's GPU figures: environment, correctness, and the timing table + plot.
# Usage: benchmarks/run_gpu.sh [OUTPUT_DIR]   (needs a CUDA device; matplotlib for the plot)
set -euo pipefail

out="${1:-bench-results}"
python="${PYTHON:-python}"
mkdir -p "$out"

"$python" -m rope_compat info | tee "$out/info.txt"
"$python" -m rope_compat verify --device cuda > "$out/verify.txt" || {
    tail -n 20 "$out/verify.txt"
    echo "verify failed; see $out/verify.txt" >&2
    exit 1
}
tail -n 5 "$out/verify.txt"

# The README's shapes and token counts; bf16 q/k sliced from fused qkv, float32 cache of
# 131072 rows, random int64 positions, CUDA-graph replays of 20 calls.
plot_arg=()
if "$python" -c "import matplotlib" 2>/dev/null; then
    plot_arg=(--plot "$out/bench.png")
fi
"$python" -m rope_compat bench --device cuda \
    --shapes llama3-8b,llama3-70b-tp,partial-rotary,gptj \
    --tokens 1,16,128,1024,8192,32768,131072 \
    --csv "$out/bench.csv" ${plot_arg[@]+"${plot_arg[@]}"} | tee "$out/bench.md"
