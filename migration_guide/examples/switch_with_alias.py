"""Keep an engine's `from vllm import _custom_ops as ops` working where vLLM is not installed.

`rope_compat.install_vllm_alias()` puts a stand-in `vllm` / `vllm._custom_ops` into
`sys.modules` that has the rotary ops only (rope-compat's). Everything else of vLLM stays
missing, as before: other attributes raise AttributeError, other submodules
ModuleNotFoundError. Same effect at start-up, with no code change: `ROPE_COMPAT_PATCH=alias`.
Where a real vLLM is installed the alias is refused (use `patch_vllm()`, switch_with_patch.py).
"""

import sys
import warnings

import torch

import rope_compat
from reference64 import check, default_freqs, rope64

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    installed = rope_compat.install_vllm_alias()  # True also if ROPE_COMPAT_PATCH=alias did it
if not installed:
    print(f"a real vLLM is installed, so no alias: {caught[0].message}")
    sys.exit(0)

# The engine's code, unchanged.
from vllm import _custom_ops as ops  # noqa: E402

assert ops.rotary_embedding is rope_compat.rotary_embedding
assert rope_compat.patch_status().alias

torch.manual_seed(0)
T, Hq, Hk, D = 5, 4, 1, 64
positions = torch.randint(0, 1024, (T,))
query = torch.randn(T, Hq * D, dtype=torch.bfloat16)
key = torch.randn(T, Hk * D, dtype=torch.bfloat16)
q0, k0 = query.clone(), key.clone()
cache = rope_compat.compute_cos_sin_cache(D, 1024)
ops.rotary_embedding(positions, query, key, D, cache, True)
check("alias query", query, rope64(q0, positions, D, default_freqs(D, 1e4), True))
check("alias key", key, rope64(k0, positions, D, default_freqs(D, 1e4), True))
print("vllm._custom_ops.rotary_embedding via install_vllm_alias(): OK")

# The rest of vLLM is still absent, so optional-feature probes fall back as before.
try:
    ops.paged_attention_v1
except AttributeError:
    pass
else:
    raise AssertionError("the alias must not pretend to have other vLLM ops")
try:
    import vllm.distributed  # noqa: F401
except ModuleNotFoundError:
    pass
else:
    raise AssertionError("the alias must not pretend to have other vLLM modules")

# Roll back: the alias leaves sys.modules; names bound from it meanwhile keep working.
assert rope_compat.uninstall_vllm_alias()
assert not rope_compat.patch_status().alias and "vllm._custom_ops" not in sys.modules
ops.rotary_embedding(positions, query, key, D, cache, True)
print("uninstall_vllm_alias(): rolled back: OK")
