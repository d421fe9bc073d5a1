"""Compatibility layer: rope-compat in place of vLLM's and sgl-kernel's rotary ops.

It holds no math; it rebinds names and registers kernels, and undoes both exactly.

- `vllm_patch`: route a real vLLM's `rotary_embedding` through rope-compat (and back).
- `alias`: a stand-in `vllm._custom_ops` with the rotary ops, where vLLM is absent.
- `startup`: the `ROPE_COMPAT_PATCH` environment variable (parsed by the top-level,
  standard-library-only `_rope_compat_startup`, which the start-up .pth file imports).
- `sglang_patch`: route an installed SGLang's rope entry points through `rope_compat.sglang`.
- `sgl_kernel_alias`: a stand-in `sgl_kernel` with the rope names, where sgl-kernel is absent.
- `_state`, `_bindings`: the patches' state and the rebinding of module globals, shared.
- `plugin`: vLLM's `vllm.general_plugins` entry point.
- `status`: `patch_status()`, what is patched now.
- `sgl`: sgl-kernel's `FusedSetKVBufferArg` (the fused KV-cache write).

This package imports none of them eagerly. Imports run one way, with no cycle: `_state`
and `_bindings` import no other compat module; `status` imports `_state`, `_bindings`, the
aliases and `startup`; `vllm_patch` and `sglang_patch` import `status`; `plugin` imports
`startup` and `vllm_patch`. The public names are re-exported by `rope_compat`.
"""
