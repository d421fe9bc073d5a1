"""Compatibility layer: rope-compat in place of vLLM's and sgl-kernel's rotary ops.

It holds no math; it rebinds names and registers kernels, and undoes both exactly.

- `vllm_patch`: route a real vLLM's `rotary_embedding` through rope-compat (and back).
- `alias`: a stand-in `vllm._custom_ops` with the rotary ops, where vLLM is absent.
- `startup`: the `ROPE_COMPAT_PATCH` environment variable, read at interpreter start-up.
- `plugin`: vLLM's `vllm.general_plugins` entry point.
- `status`: `patch_status()`, what is patched now.
- `sgl`: sgl-kernel's `FusedSetKVBufferArg` (the fused KV-cache write).

This package imports none of them eagerly: `rope_compat.api` uses `sgl`, and the others
use `rope_compat.api`. The public names are re-exported by `rope_compat`.
"""
