"""Run SGLang's own RotaryEmbedding layer code on CPU tensors, in a fresh interpreter.

Usage: python sglang_layer_child.py alias|patched; prints one JSON object: config name ->
check name -> "ok" or the failure. Run by test_sglang_layers.py, in a child so that importing
SGLang (which configures torch and logging at import) touches no other test.

- alias: vLLM is hidden and rope-compat's vllm alias installed; SGLang's RotaryEmbedding then
  binds vLLM's op (SGLang's non-CUDA branch, taken on a CPU host) to rope-compat's, and its
  forward_cuda calls it.
- patched: the names SGLang's CUDA branch imports (`apply_rope_with_cos_sin_cache_inplace`
  from its rope module, into the layer's module) are bound as on a CUDA host, then
  `rope_compat.patch_sglang()` rebinds them; forward_cuda runs its current entry point, with
  SGLang's own 4-field FusedSetKVBufferArg where the rotation is full (SGLang's kernel stores
  only then), and the float32 cache SGLang keeps on CUDA.

Each config is checked against the float64 reference on the cache the call used, and against
the same layer's forward_native.
"""

import importlib
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
MODE = sys.argv[1]

if MODE == "alias":
    from importlib.machinery import PathFinder

    class _NoVllm(PathFinder):
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            return None if name.split(".")[0] == "vllm" else PathFinder.find_spec(name, path, target)

    sys.meta_path[sys.meta_path.index(PathFinder)] = _NoVllm

import torch  # noqa: E402

import rope_compat  # noqa: E402
from rope_compat.compat._bindings import runs_code_of  # noqa: E402
from reference import rope_reference  # noqa: E402
from tolerances import assert_matches_reference  # noqa: E402

if MODE == "alias":
    assert rope_compat.install_vllm_alias(), "the vllm alias did not install"

rotary = importlib.import_module("sglang.srt.layers.rotary_embedding")
get_rope = rotary.get_rope
base = sys.modules[rotary.RotaryEmbedding.__module__]

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
# name: (heads, kv_heads, head_size, rotary_dim, max_position, base, is_neox, scaling, dtype, fused_qkv)
CONFIGS = {
    "llama-32/8x128-bf16": (32, 8, 128, 128, 8192, 500000, True, None, torch.bfloat16, True),
    "llama-32/8x128-f16": (32, 8, 128, 128, 8192, 10000, True, None, torch.float16, False),
    "llama-32/8x128-f32": (32, 8, 128, 128, 8192, 10000, True, None, torch.float32, True),
    "gptj-16/16x256-rot64-f16": (16, 16, 256, 64, 2048, 10000, False, None, torch.float16, True),
    "gptj-8/8x64-full-bf16": (8, 8, 64, 64, 2048, 10000, False, None, torch.bfloat16, False),
    "partial-32/32x128-rot64-bf16": (32, 32, 128, 64, 4096, 10000, True, None, torch.bfloat16, True),
    "llama3-32/8x128-bf16": (32, 8, 128, 128, 131072, 500000, True, LLAMA3, torch.bfloat16, True),
    "yarn-16/4x128-f16": (16, 4, 128, 128, 16384, 10000, True, YARN, torch.float16, False),
    "yarn-16/4x128-f32": (16, 4, 128, 128, 16384, 10000, True, YARN, torch.float32, True),
}
TOKENS = 37


def _check(results, name, fn):
    try:
        fn()
        results[name] = "ok"
    except Exception:  # noqa: BLE001 - every failure is reported by name
        results[name] = traceback.format_exc(limit=4)


def _close_to_native(ours, native, dtype):
    # forward_native computes in the input dtype, one rounding per op: a few ulps apart.
    eps = torch.finfo(dtype).eps
    scale = max(1.0, float(native.double().abs().max()))
    diff = float((ours.double() - native.double()).abs().max())
    assert diff <= 8 * eps * scale, f"max |ours - forward_native| = {diff}, allowed {8 * eps * scale}"


def _bound_kernel(rope):
    for attr in ("fallback_rotary_embedding", "vllm_rotary_embedding"):  # 0.5.x, 0.4.x
        fn = getattr(rope, attr, None)
        if fn is not None:
            return fn
    raise AssertionError("the layer bound no vLLM rotary_embedding (fallback_rotary_embedding / vllm_rotary_embedding)")


def run_config(cfg, results):
    heads, kv_heads, head, rot, max_pos, rope_base, is_neox, scaling, dtype, fused_qkv = cfg
    rope = get_rope(head, rot, max_pos, rope_base, is_neox, scaling, dtype)
    positions = torch.randint(0, max_pos, (TOKENS,), dtype=torch.int64)
    q_width, k_width = heads * head, kv_heads * head
    if fused_qkv:  # q and k as slices of one projection output, as models pass them
        qkv = torch.randn(TOKENS, q_width + 2 * k_width, dtype=dtype)
        query, key = qkv[:, :q_width], qkv[:, q_width: q_width + k_width]
    else:
        query, key = torch.randn(TOKENS, q_width, dtype=dtype), torch.randn(TOKENS, k_width, dtype=dtype)
    fused = None
    if MODE == "alias":
        _check(results, "binds rope-compat's op", lambda: _assert_is_ours(_bound_kernel(rope)))
    else:
        rope.use_fallback_kernel = False  # the CUDA branch for head sizes 64/128/256/512
        rope.cos_sin_cache = rope._compute_cos_sin_cache()  # float32, as SGLang keeps it on CUDA
        if rot == head:
            fused = _fused_arg(kv_heads, head, dtype)
    q0, k0 = query.clone(), key.clone()
    native_q, native_k = rope.forward_native(positions, query.clone(), key.clone())
    if fused is not None:
        k_before, v_before = fused.k_buffer.clone(), fused.v_buffer.clone()
    q1, k1 = query.clone(), key.clone()
    if fused_qkv:  # keep the strided layout for the call
        qkv1 = qkv.clone()
        q1, k1 = qkv1[:, :q_width], qkv1[:, q_width: q_width + k_width]
    extra = {} if fused is None else {"fused_set_kv_buffer_arg": fused}  # 0.4.x has no such argument
    out_q, out_k = rope.forward_cuda(positions, q1, k1, **extra)
    want_q, want_k = rope_reference(positions, q0, k0, head, rope.cos_sin_cache, is_neox)
    _check(results, "in place", lambda: _assert(out_q.data_ptr() == q1.data_ptr() and out_k.data_ptr() == k1.data_ptr()))
    _check(results, "query vs float64", lambda: assert_matches_reference(q1, want_q))
    _check(results, "key vs float64", lambda: assert_matches_reference(k1, want_k))
    _check(results, "query vs forward_native", lambda: _close_to_native(q1, native_q, dtype))
    _check(results, "key vs forward_native", lambda: _close_to_native(k1, native_k, dtype))
    if fused_qkv:
        _check(results, "value part of qkv untouched", lambda: _assert(torch.equal(qkv1[:, q_width + k_width:], qkv[:, q_width + k_width:])))
    if fused is not None:
        rows = fused.cache_loc.tolist()
        others = sorted(set(range(fused.k_buffer.shape[0])) - set(rows))
        _check(results, "k_buffer rows vs float64", lambda: assert_matches_reference(fused.k_buffer[rows], want_k))
        _check(results, "v_buffer rows are the value", lambda: _assert(torch.equal(fused.v_buffer[rows], fused.value)))
        _check(results, "other rows untouched", lambda: _assert(
            torch.equal(fused.k_buffer[others], k_before[others]) and torch.equal(fused.v_buffer[others], v_before[others])))


def _assert(ok, msg="check failed"):
    assert ok, msg


def _assert_is_ours(fn):
    assert fn is rope_compat.rotary_embedding, f"{fn!r} is not rope_compat.rotary_embedding"


def _fused_arg(kv_heads, head, dtype):
    ops = importlib.import_module("sglang.kernels.ops.attention.rope")
    rows = 3 * TOKENS
    return ops.FusedSetKVBufferArg(  # SGLang's own dataclass: value, k_buffer, v_buffer, cache_loc
        torch.randn(TOKENS, kv_heads * head, dtype=dtype),
        torch.randn(rows, kv_heads * head, dtype=dtype),  # poison: other rows must stay
        torch.randn(rows, kv_heads * head, dtype=dtype),
        torch.randperm(rows)[:TOKENS],
    )


def main():
    out = {}
    if MODE == "patched":
        try:
            ops = importlib.import_module("sglang.kernels.ops.attention.rope")
        except ModuleNotFoundError as e:  # SGLang before 0.5.20: its CUDA path is sgl-kernel's
            print(json.dumps({"unavailable": str(e)}))
            return
        original = ops.apply_rope_with_cos_sin_cache_inplace
        # What `if _is_cuda: from sglang.kernels.ops.attention.rope import ...` binds on CUDA.
        base.apply_rope_with_cos_sin_cache_inplace = original
        status = rope_compat.patch_sglang()
        setup = {}
        _check(setup, "layer module rebound", lambda: _assert(
            runs_code_of(base.apply_rope_with_cos_sin_cache_inplace,
                         rope_compat.sglang.apply_rope_with_cos_sin_cache_inplace)))
        _check(setup, "patch_status lists it", lambda: _assert(
            f"{base.__name__}.apply_rope_with_cos_sin_cache_inplace"
            in status.sglang["sglang.kernels.ops.attention.rope.apply_rope_with_cos_sin_cache_inplace"]))
        out["setup"] = setup
    for name, cfg in CONFIGS.items():
        results = {}
        try:
            run_config(cfg, results)
        except Exception:  # noqa: BLE001
            results["run"] = traceback.format_exc(limit=6)
        out[name] = results
    if MODE == "patched":
        rope_compat.unpatch_sglang()
        done = {}
        _check(done, "unpatched exactly", lambda: _assert(
            base.apply_rope_with_cos_sin_cache_inplace is original
            and ops.apply_rope_with_cos_sin_cache_inplace is original))
        out["teardown"] = done
    out["sglang_version"] = {"version": importlib.import_module("sglang.version").__version__}
    print(json.dumps(out))


main()
