"""What the benchmark times: rope-compat and its peers, each as `make(inputs) -> step(i)`.

- rope-compat: the public op, served by the compiled kernel where it is loaded.
- roofline: one in-place elementwise op (`mul_(1.0)`) over exactly the rotated elements of q
  and k, which reads and writes the bytes RoPE must move (positions and cache rows aside).
- contiguous floor: the same in-place op over a contiguous buffer of as many elements: the
  same footprint, laid out the way memory moves fastest. Stricter than the strided roofline,
  which pays for torch's generic strided elementwise kernel.
- torch eager: the package's Torch implementation (what serves devices without a kernel).
- torch.compile: RoPE in plain tensor ops (torch_rope.py) compiled as one graph, CUDA only.
- vllm / flashinfer / sgl-kernel: their kernels, where installed, with the cache dtype each
  one takes.
"""

from __future__ import annotations

from typing import Callable, Dict, List, NamedTuple, Optional

import torch

from ..api import rotary_embedding
from ..ops import torch_impl
from .external import EXTERNALS, CallInfo, External
from .inputs import Inputs
from .timing import Step
from .torch_rope import torch_rope


class Unsupported(Exception):
    """Raised by a peer's `make` when it cannot run this benchmark point; the text says why."""


class Peer(NamedTuple):
    name: str
    make: Callable[[Inputs], Step]


def _rope_compat(inp: Inputs) -> Step:
    d, neox, cache = inp.shape.head_size, inp.shape.is_neox, inp.cos_sin_cache

    def step(i: int) -> None:
        s = inp.sets[i]
        rotary_embedding(s.positions, s.query, s.key, d, cache, neox)

    return step


def _roofline(inp: Inputs) -> Step:
    def step(i: int) -> None:
        inp.sets[i].rotated.mul_(1.0)  # reads and writes each rotated element once; values kept

    return step


def _contiguous_floor(inp: Inputs) -> Step:
    flat = [torch.empty(s.rotated.numel(), dtype=s.rotated.dtype, device=s.rotated.device).normal_()
            for s in inp.sets]

    def step(i: int) -> None:
        flat[i].mul_(1.0)

    return step


def _torch_eager(inp: Inputs) -> Step:
    d, neox, cache = inp.shape.head_size, inp.shape.is_neox, inp.cos_sin_cache

    def step(i: int) -> None:
        s = inp.sets[i]
        torch_impl.rotary_embedding(s.positions, s.query, s.key, d, cache, neox)

    return step


def compile_torch_rope(backend: str = "inductor") -> Callable[..., None]:
    """`torch_rope` compiled as one graph, shapes specialised (as an engine compiles a model)."""
    # A fresh start per benchmark point: every token count is a new specialisation, and
    # dynamo's per-function recompile limit would otherwise silently fall back to eager.
    torch._dynamo.reset()
    return torch.compile(torch_rope, fullgraph=True, dynamic=False, backend=backend)


def _torch_compile(inp: Inputs) -> Step:
    if inp.cos_sin_cache.device.type != "cuda":
        raise Unsupported("CUDA only")  # Inductor's CPU build would cost more than the benchmark
    fn = compile_torch_rope()
    d, neox, cache = inp.shape.head_size, inp.shape.is_neox, inp.cos_sin_cache

    def step(i: int) -> None:
        s = inp.sets[i]
        fn(s.positions, s.query, s.key, cache, d, neox)

    return step


def _external(ext: External) -> Callable[[Inputs], Step]:
    def make(inp: Inputs) -> Step:
        shape, cache = inp.shape, inp.cos_sin_cache
        dtype = inp.sets[0].query.dtype
        cache = cache.to(ext.cache_dtype(dtype))
        call = CallInfo(
            cache.device.type, True, dtype, cache.dtype, shape.rot_dim, shape.is_neox, 0, False, True, True
        )
        why = ext.unsupported(call)
        if why is not None:
            raise Unsupported(why)
        try:
            fn = ext.load()
        except Exception as e:  # installed but unusable here
            raise Unsupported(f"import failed: {type(e).__name__}: {e}".splitlines()[0]) from None

        def step(i: int) -> None:
            s = inp.sets[i]
            fn(s.positions, s.query, s.key, shape.head_size, cache, shape.is_neox)

        return step

    return make


BUILTIN = (
    Peer("roofline", _roofline),
    Peer("contiguous floor", _contiguous_floor),
    Peer("torch eager", _torch_eager),
    Peer("torch.compile", _torch_compile),
)
SUBJECT = Peer("rope-compat", _rope_compat)


def check_peer_names(names: List[str]) -> None:
    """ValueError for a name that is neither a built-in peer nor a known external library."""
    known = [p.name for p in BUILTIN] + [e.name for e in EXTERNALS]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown peers {unknown}; known: {', '.join(known)}")


def peers(names: Optional[List[str]] = None) -> List[Peer]:
    """rope-compat first, then the built-in peers, then every installed external library.

    `names` selects peers (rope-compat is always included).
    """
    found: Dict[str, Peer] = {p.name: p for p in BUILTIN}
    for ext in EXTERNALS:
        if ext.installed():
            found[ext.name] = Peer(ext.name, _external(ext))
    if names is not None:
        check_peer_names(names)
        found = {n: p for n, p in found.items() if n in names}
    return [SUBJECT, *found.values()]
