"""sgl-kernel's fused KV-cache write: `FusedSetKVBufferArg` and the call that serves it.

sgl-kernel's `apply_rope_with_cos_sin_cache_inplace` can, in the same kernel, store the
rotated key and the value of each token in the paged KV cache: token i goes to row
`cache_loc[i]` of `k_buffer` and `v_buffer`, every head and every dim of it (the
pass-through dims of a partial rotation included). Here that is the registered op
`rotary_embedding_set_kv` (one kernel launch on CUDA), which also takes k_scale/v_scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .. import api

# The public function, not the registered op: on plain eager CUDA tensors it launches the
# kernel without the dispatcher's round trip (several microseconds of host time per call).
from ..api import rotary_embedding_set_kv


_UNSET = object()


@dataclass(init=False)
class FusedSetKVBufferArg:
    """Where to store the rotated key and the value: sgl-kernel's dataclass of this name
    (6 fields) and SGLang's (4 fields, no scales), in one class.

    Accepted forms: `FusedSetKVBufferArg(value, k_buffer, v_buffer, cache_loc)` (SGLang's),
    `FusedSetKVBufferArg(value, k_buffer, v_buffer, k_scale, v_scale, cache_loc)`
    (sgl-kernel's), and any of the fields by keyword; k_scale and v_scale default to None.

    value: `[nnz, num_kv_heads * head_size]` or `[nnz, num_kv_heads, head_size]`.
    k_buffer, v_buffer: `[rows, num_kv_heads * head_size]`, `[rows, num_kv_heads,
    head_size]` or pages `[pages, page_size, num_kv_heads, head_size]`, any float dtype.
    k_scale, v_scale: None, or the stored value is key / k_scale (value / v_scale).
    cache_loc: int32 or int64 `[nnz]`, the buffer row of each token.
    """

    value: torch.Tensor
    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    k_scale: Optional[float]
    v_scale: Optional[float]
    cache_loc: torch.Tensor

    def __init__(self, value, k_buffer, v_buffer, *args, k_scale=_UNSET, v_scale=_UNSET, cache_loc=_UNSET):
        if len(args) == 1:  # SGLang's 4-field form
            positional = {"cache_loc": args[0]}
        elif len(args) in (2, 3):  # sgl-kernel's 6-field form (cache_loc possibly by keyword)
            positional = dict(zip(("k_scale", "v_scale", "cache_loc"), args))
        elif not args:
            positional = {}
        else:
            raise TypeError(
                f"FusedSetKVBufferArg: expected (value, k_buffer, v_buffer, cache_loc) or (value, "
                f"k_buffer, v_buffer, k_scale, v_scale, cache_loc), got {3 + len(args)} positional arguments"
            )
        given = {"k_scale": k_scale, "v_scale": v_scale, "cache_loc": cache_loc}
        for name, v in given.items():
            if v is not _UNSET:
                if name in positional:
                    raise TypeError(f"FusedSetKVBufferArg: got multiple values for argument {name!r}")
                positional[name] = v
        if "cache_loc" not in positional:
            raise TypeError("FusedSetKVBufferArg: missing required argument 'cache_loc'")
        self.value, self.k_buffer, self.v_buffer = value, k_buffer, v_buffer
        self.k_scale = positional.get("k_scale")
        self.v_scale = positional.get("v_scale")
        self.cache_loc = positional["cache_loc"]


def rope_and_store(
    arg: "FusedSetKVBufferArg",
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> None:
    """Rotate `query`/`key` and store the key and `arg.value` at rows `arg.cache_loc`: one op.

    `arg` may be any object with the dataclass's fields (sgl-kernel's and SGLang's instances
    work; missing k_scale/v_scale count as None). Every check runs before anything is written.
    Wider than sgl-kernel: buffers of any float dtype (float8 included), also as pages
    `[pages, page_size, heads, head_size]`; k_scale/v_scale (stored = key / k_scale, rounded
    once); int32 or int64 cache_loc; rows outside the buffer (-1 included) are not stored.
    """
    if key is None:
        raise ValueError("key: required when fused_set_kv_buffer_arg is given")
    # SGLang's 4-field arg has no scales. A scale becomes a float here (SGLang passes floats;
    # a one-element tensor costs a host sync); inline, since this is the decode-step path.
    k_scale = getattr(arg, "k_scale", None)
    v_scale = getattr(arg, "v_scale", None)
    rotary_embedding_set_kv(
        positions, query, key, head_size, cos_sin_cache, is_neox, arg.value, arg.k_buffer,
        arg.v_buffer, arg.cache_loc, None if k_scale is None else float(k_scale),
        None if v_scale is None else float(v_scale),
    )


_python_rope_and_store = rope_and_store
# Where the extension is built, the compiled form (positional arguments only, its own errors):
# it reads the arg's fields in C and calls rotary_embedding_set_kv's entry point, so SGLang's
# fused call reads them with no Python bytecode.
rope_and_store = api.compiled_entry("rope_and_store", _python_rope_and_store, fallback=False)  # type: ignore[assignment]  # noqa: F811
