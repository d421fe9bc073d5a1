#!/usr/bin/env bash
# Reproduce the README's GPU figures: environment, correctness, the timing table, the plot, the
# fused KV-store, MRoPE and SGLang host-time benchmarks, and the precision table.
# Usage: benchmarks/run_gpu.sh [OUTPUT_DIR]   (a CUDA device; matplotlib for the plot)
# BENCH_TOKENS overrides the token counts (default: the README's).
set -euo pipefail

out="${1:-bench-results}"
python="${PYTHON:-python3}"
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$out"

"$python" -m rope_compat info > "$out/info.txt"
status=0
"$python" -m rope_compat verify --device cuda --no-external > "$out/verify.txt" || {
    status=1; tail -n 20 "$out/verify.txt"; echo "verify failed; see $out/verify.txt" >&2
}
tail -n 2 "$out/verify.txt"

# bf16 q/k sliced from fused qkv, float32 cache of 131072 rows, random int64 positions, at
# every size input sets that together exceed twice the L2, CUDA-graph replays of 100 calls;
# vLLM, FlashInfer and sgl-kernel are timed in the same run wherever they are installed.
plot_arg=()
if "$python" -c "import matplotlib" 2>/dev/null; then
    plot_arg=(--plot "$out/bench.png")
fi
"$python" -m rope_compat bench --device cuda --no-progress \
    --shapes llama3-8b,llama3-70b-tp,partial-rotary,gptj \
    --tokens "${BENCH_TOKENS:-1,16,128,1024,8192,32768,131072}" \
    --csv "$out/bench.csv" ${plot_arg[@]+"${plot_arg[@]}"} > "$out/bench.md"
"$python" "$here/summary.py" "$out/bench.csv" | tee "$out/summary.md"
# Rope with the KV-cache store beside sgl-kernel's fused kernel, where PEER_DIR holds a build of
# it from its own source (see benchmarks/README.md); without it, beside our own floors only.
"$python" "$here/fused_kv_store.py" ${PEER_DIR:+--peer-dir "$PEER_DIR/sgl_kernel"} > "$out/fused_kv_store.md" || status=1
sed -n '/^| shape | tokens | fused us/,$p' "$out/fused_kv_store.md"
# MRoPE, alone and with the fused KV store, beside the plain op and vLLM's Triton MRoPE kernel
# (its own mrope.py in PEER_DIR/vllm_mrope); without it, beside the plain op only.
"$python" "$here/mrope.py" ${PEER_DIR:+--peer-dir "$PEER_DIR/vllm_mrope"} > "$out/mrope.txt" || status=1
sed -n '/^shape /,$p' "$out/mrope.txt"
# Host time of SGLang's current call through patch_sglang() over the direct call.
"$python" "$here/sglang_host_overhead.py" --profile > "$out/sglang_host_overhead.txt" || status=1
tail -n 2 "$out/sglang_host_overhead.txt"
# Relative error against float64 at positions up to 1,000,000, f32 and bf16 caches.
"$python" "$here/precision.py" --device cuda > "$out/precision.md" || status=1
tail -n 7 "$out/precision.md"
exit $status
