"""The differentiable rotation: a functional op whose backward is the same op, inverted.

`rope_compat::rotary_embedding_functional` returns rotated copies of query and key and leaves
its inputs alone, which lets it carry an autograd formula (torch.library.register_autograd
takes functional ops only; the in-place ops refuse tensors that require grad, see
checks.GRAD_MESSAGE). RoPE is orthogonal: the gradient of `y = R x` is `Rᵀ g = R⁻¹ g`, the
rotation by the negative angle, which is the same op with `inverse` flipped. Its kernel is the
in-place op on clones, so every backend of the in-place op (the CUDA kernel included) serves
it forward and backward, and the backward is itself differentiable (double backward).

Query and key may also be float64 here (not in the in-place op): rotated in float64 math by
the Torch implementation, on any device, for gradient checks and float64 references.

The cos/sin cache gets no gradient: a cache that requires grad is refused (RuntimeError)
rather than left with none. Positions are integers.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .checks import check_rotary_args, check_rotary_types
from . import torch_impl
from .library import NAMESPACE, lib, rotary_embedding_op

FUNCTIONAL_SCHEMA = (
    "rotary_embedding_functional(Tensor positions, Tensor query, Tensor? key, int head_size, "
    "Tensor cos_sin_cache, bool is_neox, int rope_dim_offset=0, bool inverse=False) -> (Tensor, Tensor?)"
)
lib.define(FUNCTIONAL_SCHEMA)

CACHE_GRAD_MESSAGE = (
    "cos_sin_cache: requires grad, but rope_compat computes no gradient for the cache (only "
    "for query and key); pass cos_sin_cache.detach()"
)


@torch.library.impl(lib, "rotary_embedding_functional", "CompositeExplicitAutograd")
def _functional(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset=0, inverse=False):
    # Check the originals' types first: clone() of a non-tensor would fail with its own error.
    check_rotary_types(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset, inverse)
    q = query.clone()
    k = None if key is None else key.clone()
    if query.dtype == torch.float64:  # float64 math, by the Torch implementation on any device
        torch_impl.rotary_embedding(
            positions, q, k, head_size, cos_sin_cache, is_neox, rope_dim_offset, inverse, allow_float64=True
        )
    else:
        rotary_embedding_op(positions, q, k, head_size, cos_sin_cache, is_neox, rope_dim_offset, inverse)
    return q, k


@torch.library.register_fake(f"{NAMESPACE}::rotary_embedding_functional", lib=lib)
def _functional_fake(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset=0, inverse=False):
    check_rotary_types(positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset, inverse)
    # Outputs laid out as clone() lays them out; the checks see what the kernel will see.
    q = torch.empty_like(query)
    k = None if key is None else torch.empty_like(key)
    check_rotary_args(positions, q, k, head_size, cos_sin_cache, rope_dim_offset, allow_float64=True)
    return q, k


def _setup_context(ctx, inputs, output) -> None:
    positions, query, key, head_size, cos_sin_cache, is_neox, rope_dim_offset, inverse = inputs
    if cos_sin_cache.requires_grad:
        raise RuntimeError(CACHE_GRAD_MESSAGE)
    ctx.save_for_backward(positions, cos_sin_cache)
    ctx.args = (head_size, is_neox, rope_dim_offset, not inverse)


def _backward(ctx, grad_q: Optional[torch.Tensor], grad_k: Optional[torch.Tensor]) -> Tuple:
    positions, cos_sin_cache = ctx.saved_tensors
    head_size, is_neox, rope_dim_offset, inverse = ctx.args
    rest = (head_size, cos_sin_cache, is_neox, rope_dim_offset, inverse)
    if grad_q is not None:
        grad_q, grad_k = rotary_embedding_functional_op(positions, grad_q, grad_k, *rest)
    elif grad_k is not None:  # only the key's output was used
        grad_k, _ = rotary_embedding_functional_op(positions, grad_k, None, *rest)
    return None, grad_q, grad_k, None, None, None, None, None


torch.library.register_autograd(
    f"{NAMESPACE}::rotary_embedding_functional", _backward, setup_context=_setup_context, lib=lib
)

rotary_embedding_functional_op = torch.ops.rope_compat.rotary_embedding_functional.default


def needs_grad(query: object, key: object, cos_sin_cache: object) -> bool:
    """Whether a rotation of these tensors must be recorded by autograd (False for non-tensors,
    which the checks then reject)."""
    return torch.is_grad_enabled() and (
        getattr(query, "requires_grad", False) or getattr(key, "requires_grad", False)
        or getattr(cos_sin_cache, "requires_grad", False)
    )
