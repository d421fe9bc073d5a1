"""Argument checks for the rotary ops: the one statement of what the op accepts.

The Torch implementation and the fake (meta) implementation call `check_rotary_args`.
The CUDA kernel repeats the same checks in C++ (csrc/ops.cpp), because a Python pre-check
would cost more host time per eager call than the kernel launch itself; it raises the same
Python exception types with the same messages, so every backend names the same argument.

Argument types come first, all of them in argument order, then values: the CUDA entry point
converts its arguments in that order before it checks any value, so the first bad argument is
the one named on every path. A type error names the argument, what was expected and the type's
name as `type(x).__name__` spells it. The registered op goes through the dispatcher, which
converts its arguments by schema first: for an argument it cannot convert (a float head_size,
a string for a tensor) the dispatcher raises its own RuntimeError, which names the argument and
the schema's type, before any kernel runs; None for a tensor reaches these checks.

These checks never read tensor data, so they cost no device sync and also run on fake
tensors. Position bounds need the data: the Torch implementation checks them on the CPU,
where its cache gather reads the positions anyway (`check_positions_in_range`); on other
devices a token whose position is outside `[0, cache rows)` is left untouched by every backend.
"""

from __future__ import annotations

import operator
from typing import NamedTuple, Optional, Tuple

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
POSITION_DTYPES = (torch.int32, torch.int64)
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

# The in-place ops write query and key behind autograd's back, so they refuse tensors that
# record gradients (never a wrong gradient); the out-of-place function is differentiable.
# The CUDA entry point (csrc/ops.cpp) raises this same text.
GRAD_MESSAGE = (
    "{name}: requires grad, but rope_compat's in-place ops are not differentiable; use "
    "rope_compat.apply_rope_with_cos_sin_cache (out of place, differentiable), or call the "
    "in-place op under torch.no_grad() or torch.inference_mode()"
)


def _type_name(x: object) -> str:
    return type(x).__name__


def check_tensor(name: str, x: object) -> None:
    """TypeError unless `x` is a tensor."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {_type_name(x)}")


def check_optional_tensor(name: str, x: object) -> None:
    """TypeError unless `x` is a tensor or None."""
    if x is not None and not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor or None, got {_type_name(x)}")


def check_int(name: str, v: object) -> int:
    """`v` as an int: an int (bool included, as the schema's int takes it) or any object
    with `__index__` (numpy integers), within int64; TypeError otherwise."""
    if type(v) is not int:
        try:
            v = operator.index(v)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(f"{name}: expected an int (64-bit), got {_type_name(v)}") from None
    if not _INT64_MIN <= v <= _INT64_MAX:
        raise TypeError(f"{name}: expected an int (64-bit), got {_type_name(v)}")
    return v


def check_bool(name: str, v: object) -> bool:
    """`v` as a bool: a bool, numpy's bool or an int (as the schema's bool takes it);
    TypeError otherwise."""
    if not isinstance(v, int) and type(v).__name__ not in ("bool", "bool_"):
        raise TypeError(f"{name}: expected a bool, got {_type_name(v)}")
    return bool(v)


def check_optional_float(name: str, v: object) -> None:
    """TypeError unless `v` is a float, an int or None."""
    if v is not None and not isinstance(v, (float, int)):
        raise TypeError(f"{name}: expected a float or None, got {_type_name(v)}")


def check_rotary_types(
    positions: object, query: object, key: object, head_size: object, cos_sin_cache: object,
    is_neox: object, rope_dim_offset: object = 0, inverse: object = False,
) -> Tuple[int, int]:
    """The argument types of `rotary_embedding`, in argument order; (head_size, rope_dim_offset)."""
    check_tensor("positions", positions)
    check_tensor("query", query)
    check_optional_tensor("key", key)
    head_size = check_int("head_size", head_size)
    check_tensor("cos_sin_cache", cos_sin_cache)
    check_bool("is_neox", is_neox)
    rope_dim_offset = check_int("rope_dim_offset", rope_dim_offset)
    check_bool("inverse", inverse)
    return head_size, rope_dim_offset


def check_batched_types(
    positions: object, query: object, key: object, head_size: object, cos_sin_cache: object,
    is_neox: object, rot_dim: object, cos_sin_cache_offsets: object,
) -> Tuple[int, int]:
    """The argument types of `batched_rotary_embedding`, in order; (head_size, rot_dim)."""
    head_size, _ = check_rotary_types(positions, query, key, head_size, cos_sin_cache, is_neox)
    rot_dim = check_int("rot_dim", rot_dim)
    check_tensor("cos_sin_cache_offsets", cos_sin_cache_offsets)
    return head_size, rot_dim


def check_set_kv_types(
    positions: object, query: object, key: object, head_size: object, cos_sin_cache: object,
    is_neox: object, value: object, k_buffer: object, v_buffer: object, cache_loc: object,
    k_scale: object = None, v_scale: object = None, rope_dim_offset: object = 0,
) -> Tuple[int, int]:
    """The argument types of `rotary_embedding_set_kv`, in order; (head_size, rope_dim_offset)."""
    check_tensor("positions", positions)
    check_tensor("query", query)
    check_tensor("key", key)  # the stored key: required
    head_size = check_int("head_size", head_size)
    check_tensor("cos_sin_cache", cos_sin_cache)
    check_bool("is_neox", is_neox)
    for name, t in (("value", value), ("k_buffer", k_buffer), ("v_buffer", v_buffer), ("cache_loc", cache_loc)):
        check_tensor(name, t)
    check_optional_float("k_scale", k_scale)
    check_optional_float("v_scale", v_scale)
    return head_size, check_int("rope_dim_offset", rope_dim_offset)


def check_int_list(name: str, v: object) -> list:
    """`v` as a list of ints: a list or tuple whose items pass check_int; TypeError otherwise."""
    if not isinstance(v, (list, tuple)):
        raise TypeError(f"{name}: expected a list of ints, got {_type_name(v)}")
    return [check_int(name, x) for x in v]


def check_mrope_types(
    positions: object, query: object, key: object, head_size: object, cos_sin_cache: object,
    is_neox: object, mrope_section: object, mrope_interleaved: object = False, rope_dim_offset: object = 0,
    inverse: object = False,
) -> Tuple[int, list, int]:
    """The argument types of `mrope_rotary_embedding`, in order; (head_size, mrope_section,
    rope_dim_offset)."""
    head_size, _ = check_rotary_types(positions, query, key, head_size, cos_sin_cache, is_neox)
    sections = check_int_list("mrope_section", mrope_section)
    check_bool("mrope_interleaved", mrope_interleaved)
    rope_dim_offset = check_int("rope_dim_offset", rope_dim_offset)
    check_bool("inverse", inverse)
    return head_size, sections, rope_dim_offset


def check_mrope_set_kv_types(
    positions: object, query: object, key: object, head_size: object, cos_sin_cache: object,
    is_neox: object, mrope_section: object, value: object, k_buffer: object, v_buffer: object,
    cache_loc: object, k_scale: object = None, v_scale: object = None, mrope_interleaved: object = False,
    rope_dim_offset: object = 0,
) -> Tuple[int, list, int]:
    """The argument types of `mrope_rotary_embedding_set_kv`, in order;
    (head_size, mrope_section, rope_dim_offset)."""
    check_tensor("positions", positions)
    check_tensor("query", query)
    check_tensor("key", key)  # the stored key: required
    head_size = check_int("head_size", head_size)
    check_tensor("cos_sin_cache", cos_sin_cache)
    check_bool("is_neox", is_neox)
    sections = check_int_list("mrope_section", mrope_section)
    for name, t in (("value", value), ("k_buffer", k_buffer), ("v_buffer", v_buffer), ("cache_loc", cache_loc)):
        check_tensor(name, t)
    check_optional_float("k_scale", k_scale)
    check_optional_float("v_scale", v_scale)
    check_bool("mrope_interleaved", mrope_interleaved)
    return head_size, sections, check_int("rope_dim_offset", rope_dim_offset)


def check_no_grad(query: torch.Tensor, key: Optional[torch.Tensor], *written: Tuple[str, torch.Tensor]) -> None:
    """RuntimeError if grad mode is on and a tensor the op writes (query, key, and the
    `written` (name, tensor) pairs) requires grad (see GRAD_MESSAGE)."""
    if torch.is_grad_enabled():
        for name, x in (("query", query), ("key", key), *written):
            if x is not None and x.requires_grad:
                raise RuntimeError(GRAD_MESSAGE.format(name=name))


class RotaryShape(NamedTuple):
    num_tokens: int
    num_heads: int
    num_kv_heads: int
    rot_dim: int


def _heads(name: str, x: torch.Tensor, token_shape: torch.Size, head_size: int) -> int:
    """Number of heads in `x`, after checking its layout against the token dims."""
    shape, pd = x.shape, len(token_shape)
    if len(shape) not in (pd + 1, pd + 2):
        raise ValueError(
            f"{name}: expected {pd + 1} dims [*positions.shape, heads * head_size] or "
            f"{pd + 2} dims [*positions.shape, heads, head_size], got shape {tuple(shape)}"
        )
    if shape[:pd] != token_shape:
        raise ValueError(
            f"{name}: leading dims {tuple(shape[:pd])} must match positions.shape "
            f"{tuple(token_shape)} (the same number of tokens)"
        )
    if len(shape) == pd + 2:
        if shape[-1] != head_size:
            raise ValueError(f"{name}: last dim is {shape[-1]}, expected head_size={head_size}")
        heads = shape[-2]
    else:
        if shape[-1] % head_size != 0:
            raise ValueError(
                f"{name}: hidden size {shape[-1]} is not divisible by head_size={head_size}"
            )
        heads = shape[-1] // head_size
    if x.stride(-1) != 1 and x.numel() > 0:
        raise ValueError(f"{name}: last dim must be contiguous (stride 1), got stride {x.stride(-1)}")
    return heads


def check_rotary_args(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: Optional[torch.Tensor],
    head_size: int,
    cos_sin_cache: torch.Tensor,
    rope_dim_offset: int = 0,
    cache_offsets: Optional[torch.Tensor] = None,
    allow_float64: bool = False,
) -> RotaryShape:
    """Raise ValueError/TypeError/IndexError naming the bad argument; return derived sizes.

    Eager CPU calls run this on every call, so it reads each tensor attribute once.
    """
    token_shape = positions.shape
    if positions.dtype not in POSITION_DTYPES:
        raise TypeError(f"positions: expected dtype int32 or int64, got {positions.dtype}")
    if len(token_shape) not in (1, 2):
        raise ValueError(
            f"positions: expected shape [num_tokens] or [batch, seq_len], got {tuple(token_shape)}"
        )
    if not positions.is_contiguous():
        raise ValueError("positions: must be contiguous")
    dtype = query.dtype
    if dtype not in FLOAT_DTYPES and not (allow_float64 and dtype == torch.float64):
        expected = "float32, float16, bfloat16 or float64" if allow_float64 else "float32, float16 or bfloat16"
        raise TypeError(f"query: expected dtype {expected}, got {dtype}")
    if key is not None and key.dtype != dtype:
        raise TypeError(f"key: dtype {key.dtype} must equal query's dtype {dtype}")
    if cos_sin_cache.dtype not in CACHE_DTYPES:
        raise TypeError(
            f"cos_sin_cache: expected a float dtype (float32, float16, bfloat16, float64), "
            f"got {cos_sin_cache.dtype}"
        )
    device = positions.device
    for name, t in (
        ("query", query), ("key", key), ("cos_sin_cache", cos_sin_cache),
        ("cos_sin_cache_offsets", cache_offsets),
    ):
        if t is not None and t.device != device:
            raise ValueError(
                f"{name}: on device {t.device}, but positions is on {device}; "
                "all tensors must be on one device"
            )
    if head_size <= 0:
        raise ValueError(f"head_size: must be positive, got {head_size}")
    cache_shape = cos_sin_cache.shape
    if len(cache_shape) != 2:
        raise ValueError(
            f"cos_sin_cache: expected 2 dims [max_position, rot_dim], got shape {tuple(cache_shape)}"
        )
    rot_dim = cache_shape[1]
    if rot_dim <= 0 or rot_dim % 2 != 0:
        raise ValueError(f"cos_sin_cache: rot_dim (size of dim 1) must be even and positive, got {rot_dim}")
    if cos_sin_cache.stride(1) != 1 and cache_shape[0] > 0:
        raise ValueError("cos_sin_cache: last dim must be contiguous (stride 1)")
    if rope_dim_offset < 0:
        raise ValueError(f"rope_dim_offset: must be >= 0, got {rope_dim_offset}")
    if rope_dim_offset + rot_dim > head_size:
        raise ValueError(
            f"rope_dim_offset + rot_dim = {rope_dim_offset} + {rot_dim} exceeds head_size={head_size}"
        )
    num_heads = _heads("query", query, token_shape, head_size)
    num_kv_heads = num_heads
    if key is not None:
        num_kv_heads = _heads("key", key, token_shape, head_size)
        if num_kv_heads == 0 or num_heads % num_kv_heads != 0:
            raise ValueError(
                f"key: query heads ({num_heads}) must be a multiple of key heads ({num_kv_heads})"
            )
    num_tokens = positions.numel()
    if cache_offsets is not None:
        if cache_offsets.dtype not in POSITION_DTYPES:
            raise TypeError(
                f"cos_sin_cache_offsets: expected dtype int32 or int64, got {cache_offsets.dtype}"
            )
        if cache_offsets.numel() != num_tokens or not cache_offsets.is_contiguous():
            raise ValueError(
                f"cos_sin_cache_offsets: expected a contiguous tensor of {num_tokens} "
                f"elements (one per token), got shape {tuple(cache_offsets.shape)}"
            )
    return RotaryShape(num_tokens, num_heads, num_kv_heads, rot_dim)


def check_positions_in_range(rows: torch.Tensor, cache_rows: int) -> None:
    """Raise IndexError naming positions if a cache row index lies outside [0, cache_rows)."""
    lo, hi = (int(v) for v in torch.aminmax(rows))
    if lo < 0 or hi >= cache_rows:
        raise IndexError(
            f"positions: cache rows must lie in [0, {cache_rows}), got values in [{lo}, {hi}]"
        )
