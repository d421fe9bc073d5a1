"""Public functions: vLLM's op signature, FlashInfer's and sgl-kernel's names, and helpers.

Every rotation goes through one registered op (`torch.ops.rope_compat.rotary_embedding`),
so eager calls, torch.compile and CUDA graphs all see the same thing. The wrappers stay thin
on purpose: for decode-sized calls the host time of the wrapper is part of the latency.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional, Tuple

import torch

from .ops import batched_rotary_embedding_op, extension, rotary_embedding_op, torch_impl
from .ops.autograd import needs_grad, rotary_embedding_functional_op
from .ops.checks import (
    check_batched_types, check_int, check_mrope_set_kv_types, check_mrope_types, check_rotary_types, check_set_kv_types, check_tensor,
)
from .ops.library import mrope_rotary_embedding_op, mrope_rotary_embedding_set_kv_op, rotary_embedding_set_kv_op

if TYPE_CHECKING:  # compat.sgl imports this module, so only the type checker imports it here
    from .compat.sgl import FusedSetKVBufferArg

# The compiled CUDA module (None without a CUDA build). Its `launch` checks the arguments and
# launches the CUDA kernel without a dispatcher round trip, which costs more host time than a
# decode-sized kernel. Eager CUDA calls use it; traced calls (torch.compile) and every other
# device go through the registered op.
_C = extension.direct_binding()
_C_mrope = getattr(_C, "mrope_launch", None)
_C_mrope_set_kv = getattr(_C, "mrope_set_kv_launch", None)
# is_dynamo_compiling is a constant False in eager code (cheaper than is_compiling).
_is_compiling = getattr(torch.compiler, "is_dynamo_compiling", torch.compiler.is_compiling)

# On the CPU the op's kernel is the compiled CPU kernel where it loaded (csrc/cpu_ops.cpp),
# else the Torch implementation. The dispatcher's round trip into either costs more host time
# than a decode-sized rotation, so plain eager calls call the kernel's `launch` (a C function
# with the op's checks) or the Torch implementation directly, which does exactly what the op
# would. Everything the dispatcher would make a difference for still goes through the op:
# tracing and compiling, tensor subclasses (fake tensors), dispatch and function modes,
# functorch transforms, autograd (tensors that require grad), and a CPU kernel registered by
# anyone else.
_CPU = extension.cpu_binding()
_cpu_direct: Optional[Callable[..., None]] = None
if _CPU is not None:
    _cpu_direct = _CPU.launch
elif not torch._C._dispatch_has_kernel_for_dispatch_key("rope_compat::rotary_embedding", "CPU"):
    _cpu_direct = torch_impl.rotary_embedding


def _eager_cuda(launch: object, query: torch.Tensor) -> bool:
    """Whether `launch` (an entry of the compiled CUDA module, None without one) may take this
    call directly: a plain CUDA tensor, eager, no dispatch mode. Autograd needs no check here:
    the entries refuse tensors that require grad as the op does."""
    return (
        launch is not None
        and type(query) is torch.Tensor  # not a fake or other subclass tensor
        and query.is_cuda
        and not _is_compiling()
        and not torch._C._len_torch_dispatch_stack()
    )


def _plain_eager_cpu(query: torch.Tensor, key: Optional[torch.Tensor]) -> bool:
    return (
        _cpu_direct is not None
        and type(query) is torch.Tensor
        and query.is_cpu
        and not query.requires_grad
        and (key is None or (type(key) is torch.Tensor and not key.requires_grad))
        and not _is_compiling()
        and not torch._C._len_torch_dispatch_stack()
        and not torch._C._is_torch_function_mode_enabled()
        and not torch._C._are_functorch_transforms_active()
    )


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    rope_dim_offset: int = 0,
    inverse: bool = False,
) -> None:
    """Apply rotary embedding to `query` and `key` in place, exactly as vLLM's op does.

    positions: int32/int64 `[T]` or `[B, S]`. query/key: `[*positions.shape, H * head_size]`
    or `[*positions.shape, H, head_size]`, last dim contiguous, any other strides (slices of a
    fused qkv tensor work). key may be None. cos_sin_cache: `[max_position, rot_dim]`, each
    row `[cos | sin]`, any float dtype. Dims `[rope_dim_offset, rope_dim_offset + rot_dim)` of
    each head rotate, NeoX style (split halves) if `is_neox` else GPT-J style (interleaved);
    `inverse` rotates by the negative angle.
    """
    if _eager_cuda(_C, query):
        _C.launch(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset, inverse)
    elif _plain_eager_cpu(query, key):
        _cpu_direct(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset, inverse)
    else:
        # The dispatcher would convert some wrong types by schema (a numpy float to an int,
        # None to a bool) and reject others with its own RuntimeError: check them first.
        check_rotary_types(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset, inverse)
        rotary_embedding_op(
            positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset, inverse
        )


_python_forms: dict = {}  # entry point name -> the Python function it stands for


def compiled_entry(name: str, python_fn: Callable, fallback: bool = True) -> Callable:
    """The compiled module's entry point `name` standing for `python_fn`, or `python_fn`
    without the module.

    An entry point is a C function with python_fn's signature: the calls it can take (plain
    CUDA tensors, the common argument forms) launch the kernel with no Python frame at all,
    which is the eager host time of a decode step. With `fallback` it hands every other call
    to python_fn; torch.compile traces python_fn in its place."""
    if _C is None:
        return python_fn
    entry = getattr(_C, name)
    if fallback:
        _C.set_fallback(name, python_fn)
    torch.compiler.substitute_in_graph(entry)(python_fn)
    _python_forms[name] = python_fn
    return entry


compiled_entry_copies: dict = {}  # entry point name -> its copy, once made


def compiled_entry_copy(name: str) -> Callable[..., None]:
    """A distinct function object for the entry point `name`, traced like it; one per name and
    process (torch.compile accepts one registration per object)."""
    copy = compiled_entry_copies.get(name)
    if copy is None:
        copy = _C.new_entry(name, object())
        torch.compiler.substitute_in_graph(copy)(_python_forms[name])
        compiled_entry_copies[name] = copy
    return copy


_python_rotary_embedding = rotary_embedding
rotary_embedding = compiled_entry("rotary_embedding", _python_rotary_embedding)  # type: ignore[assignment]  # noqa: F811


# The name proposed for this API in FlashInfer issue 530; same arguments as vLLM's op.
apply_rope_inplace_with_cache = rotary_embedding


def apply_rope_with_cos_sin_cache_inplace(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
    fused_set_kv_buffer_arg: Optional["FusedSetKVBufferArg"] = None,
    enable_pdl: Optional[bool] = None,
) -> None:
    """FlashInfer's and sgl-kernel's in-place API (same arguments and defaults); any cache dtype.

    With `fused_set_kv_buffer_arg` (sgl-kernel's `FusedSetKVBufferArg` or ours), the rotated
    key and the value are also stored at rows `cache_loc` of `k_buffer` and `v_buffer`.
    """
    # enable_pdl asks sgl-kernel to launch with programmatic dependent launch (Hopper and
    # newer: the kernel's prologue overlaps the previous kernel's tail). It changes timing
    # only, never results, and our kernel does not use it, so it is accepted and ignored.
    del enable_pdl
    if fused_set_kv_buffer_arg is not None:
        from .compat.sgl import rope_and_store  # only this path needs it

        rope_and_store(fused_set_kv_buffer_arg, positions, query, key, head_size, cos_sin_cache, is_neox)
        return
    rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)


def rotary_embedding_set_kv(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    value: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    cache_loc: torch.Tensor,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
    rope_dim_offset: int = 0,
) -> None:
    """`rotary_embedding`, then token t's rotated key and value stored at row `cache_loc[t]`
    of `k_buffer` / `v_buffer` (one CUDA launch; rope_compat/ops/kv_store.py has the rules).

    Buffers: `[rows, heads * head_size]`, `[rows, heads, head_size]` or pages `[pages,
    page_size, heads, head_size]` (`cache_loc` the slot index), any float dtype including
    float8; stored = key / k_scale (value / v_scale) rounded once. `cache_loc` rows outside
    the buffer (-1 included) are not stored.
    """
    if _eager_cuda(_C, query):
        # Straight to the launch (the registered op's CUDA kernel is this same function): the
        # dispatcher's round trip costs more host time than a decode-sized call.
        _C.set_kv_launch(
            positions, query, key, head_size, cos_sin_cache, is_neox, value, k_buffer, v_buffer,
            cache_loc, k_scale, v_scale, rope_dim_offset,
        )
    else:
        args = (
            positions, query, key, head_size, cos_sin_cache, is_neox, value, k_buffer, v_buffer,
            cache_loc, k_scale, v_scale, rope_dim_offset,
        )
        check_set_kv_types(*args)  # before the dispatcher converts or rejects types by schema
        rotary_embedding_set_kv_op(*args)


_python_rotary_embedding_set_kv = rotary_embedding_set_kv
# SGLang's fused call reaches this at every layer of every decode step (compiled_entry: why).
rotary_embedding_set_kv = compiled_entry(  # type: ignore[assignment]  # noqa: F811
    "rotary_embedding_set_kv", _python_rotary_embedding_set_kv
)


def mrope_rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    mrope_section: "list[int]",
    mrope_interleaved: bool = False,
    rope_dim_offset: int = 0,
    inverse: bool = False,
) -> None:
    """Multimodal RoPE in place: positions `[3, T]` (temporal, height, width); rotated pair i
    reads cache row `positions[section(i), t]`, sections contiguous (Qwen2-VL, Qwen2.5-VL) or
    interleaved (Qwen3-VL). One CUDA launch; rope_compat/ops/mrope.py has the rules."""
    if _eager_cuda(_C_mrope, query):
        # Eager CUDA calls skip the dispatcher round trip, as rotary_embedding does.
        _C_mrope(
            positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section,
            mrope_interleaved, rope_dim_offset, inverse,
        )
        return
    # The types first: the dispatcher would convert some by schema and reject others itself.
    head_size, sections, rope_dim_offset = check_mrope_types(
        positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section, mrope_interleaved,
        rope_dim_offset, inverse,
    )
    mrope_rotary_embedding_op(
        positions, query, key, head_size, cos_sin_cache, is_neox, sections, mrope_interleaved,
        rope_dim_offset, inverse,
    )


def mrope_rotary_embedding_set_kv(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    mrope_section: "list[int]",
    value: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    cache_loc: torch.Tensor,
    k_scale: Optional[float] = None,
    v_scale: Optional[float] = None,
    mrope_interleaved: bool = False,
    rope_dim_offset: int = 0,
) -> None:
    """`mrope_rotary_embedding`, then token t's rotated key (every dim of every head) and its
    value stored at row `cache_loc[t]` of `k_buffer` / `v_buffer`, in one CUDA launch.

    The rotation is mrope_rotary_embedding's (positions `[3, T]`, `mrope_section`,
    `mrope_interleaved`, `rope_dim_offset`; no inverse); the store is rotary_embedding_set_kv's
    (rope_compat/ops/kv_store.py): buffers `[rows, heads * head_size]`, `[rows, heads,
    head_size]` or pages `[pages, page_size, heads, head_size]`, any float dtype including
    float8, stored = key / k_scale (value / v_scale) rounded once; `cache_loc` rows outside the
    buffer (-1 included) are not stored.
    """
    if _eager_cuda(_C_mrope_set_kv, query):
        # Straight to the launch (the registered op's CUDA kernel is this same function).
        _C_mrope_set_kv(
            positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section, value, k_buffer, v_buffer,
            cache_loc, k_scale, v_scale, mrope_interleaved, rope_dim_offset,
        )
        return
    # The types first: the dispatcher would convert some by schema and reject others itself.
    head_size, sections, rope_dim_offset = check_mrope_set_kv_types(
        positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section, value, k_buffer, v_buffer,
        cache_loc, k_scale, v_scale, mrope_interleaved, rope_dim_offset,
    )
    mrope_rotary_embedding_set_kv_op(
        positions, query, key, head_size, cos_sin_cache, is_neox, sections, value, k_buffer, v_buffer,
        cache_loc, k_scale, v_scale, mrope_interleaved, rope_dim_offset,
    )


def apply_rope_with_cos_sin_cache(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """FlashInfer's out-of-place API: returns rotated copies, leaves the inputs untouched.

    Differentiable with respect to query and key (the backward is the inverse rotation, by the
    same kernel); the cos/sin cache gets no gradient (a cache that requires grad is refused).
    Also takes float64 query and key (float64 math, the Torch implementation on any device).
    """
    check_rotary_types(positions, query, key, head_size, cos_sin_cache, is_neox)
    if needs_grad(query, key, cos_sin_cache) or query.dtype == torch.float64:
        return rotary_embedding_functional_op(positions, query, key, head_size, cos_sin_cache, is_neox)
    q = query.clone()
    k = None if key is None else key.clone()
    rotary_embedding(positions, q, k, head_size, cos_sin_cache, is_neox)
    return q, k


def batched_rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    rot_dim: int,
    cos_sin_cache_offsets: torch.Tensor,
) -> None:
    """vLLM's former multi-LoRA op: token t reads cache row `offsets[t] + positions[t]`."""
    args = (positions, query, key, head_size, cos_sin_cache, is_neox, rot_dim, cos_sin_cache_offsets)
    check_batched_types(*args)  # before the dispatcher converts or rejects types by schema
    batched_rotary_embedding_op(*args)


def positions_from_offsets(
    indptr: torch.Tensor, offsets: torch.Tensor, num_tokens: Optional[int] = None
) -> torch.Tensor:
    """Convert FlashInfer's ragged (indptr, offsets) to per-token positions.

    Request i owns tokens `[indptr[i], indptr[i+1])`, whose positions count up from
    `offsets[i]`: indptr `[0, 1, 5, 10]`, offsets `[4, 6, 3]` gives
    `[4, 6, 7, 8, 9, 3, 4, 5, 6, 7]`. Pass `num_tokens` (= indptr[-1]) to avoid reading
    it back from the device, which would sync the host. Returns int64 on indptr's device.
    """
    check_tensor("indptr", indptr)
    check_tensor("offsets", offsets)
    if num_tokens is not None:
        num_tokens = check_int("num_tokens", num_tokens)
    if indptr.dim() != 1 or indptr.numel() < 1:
        raise ValueError(f"indptr: expected a 1-D tensor of batch_size + 1 elements, got {tuple(indptr.shape)}")
    if offsets.dim() != 1 or offsets.numel() != indptr.numel() - 1:
        raise ValueError(
            f"offsets: expected {indptr.numel() - 1} elements (one per request), got {tuple(offsets.shape)}"
        )
    if indptr.dtype not in (torch.int32, torch.int64) or offsets.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"indptr, offsets: expected integer dtypes, got {indptr.dtype}, {offsets.dtype}")
    if offsets.device != indptr.device:
        raise ValueError(f"offsets: on {offsets.device}, but indptr is on {indptr.device}")
    indptr = indptr.long()
    if num_tokens is None:
        num_tokens = int(indptr[-1])
    lengths = indptr[1:] - indptr[:-1]
    request = torch.repeat_interleave(
        torch.arange(lengths.numel(), device=indptr.device), lengths, output_size=num_tokens
    )
    token = torch.arange(num_tokens, device=indptr.device)
    return token - indptr[request] + offsets.long()[request]
