"""Random cases for fuzzing the rotary op, shared by tests/test_fuzz.py and benchmarks/fuzz_long.py.

A case is a `FuzzSpec`: plain numbers and names, so a failing case prints in full and can be
rebuilt. `draw_spec` draws one through a `Chooser`, which hypothesis (shrinking) or
`random.Random` (long runs) implements. `run_spec` builds the tensors, runs the op and
compares with the float64 reference:

- q and k are views into poisoned parent tensors (fused qkv with padding, separate tensors
  with padding, or head-major storage), optionally every other token, optionally misaligned,
  and for `[B, S]` positions optionally `q[:, :S]` of a longer sequence (token strides that
  do not collapse into one);
- every element of the parents outside the rotated dims of tokens with in-range positions
  must come back bit-identical, the rotated ones must match the reference.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, List, Optional, Protocol, Sequence, Tuple, TypeVar

import torch

import rope_compat
from cases import bits
from reference import rope_reference

T = TypeVar("T")

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CACHE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
HEAD_SIZES = (2, 3, 8, 12, 16, 32, 40, 48, 64, 72, 80, 96, 100, 128, 160, 192, 256)
CACHE_ROWS = (1, 2, 5, 64, 1000, 4096, 1 << 17)
# Caps that keep building and checking a case cheap (10,000 cases take a few minutes).
MAX_CACHE_ELEMENTS = 1 << 17
MAX_PARENT_ELEMENTS = 1 << 14  # of q, k and v together: caps the number of tokens
STORAGES = ("fused", "separate", "head_major")


class Chooser(Protocol):
    def integer(self, lo: int, hi: int) -> int:
        """An integer in [lo, hi]."""

    def choice(self, options: Sequence[T]) -> T:
        """One of `options`."""


class RandomChooser:
    """Chooser over a `random.Random` (for long runs without shrinking)."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def choice(self, options: Sequence[T]) -> T:
        return self.rng.choice(list(options))


@dataclass(frozen=True)
class FuzzSpec:
    tokens: Tuple[int, ...]  # positions.shape: (T,) or (B, S)
    token_step: int  # 2: q/k take every other entry of the first token dim of their parent
    seq_pad: int  # extra entries of the last token dim in the parent (q[:, :S] of a longer one)
    storage: str  # see STORAGES
    heads_form: bool  # q/k as [*tokens, H, D] (else [*tokens, H * D])
    lead: int  # elements before q (and k) in a parent row: nonzero misaligns the vectors
    tail: int  # elements after the last head in a parent row
    heads: int
    kv_heads: int
    with_key: bool
    head_size: int
    rot_dim: int
    rope_dim_offset: int
    is_neox: bool
    inverse: bool
    dtype: torch.dtype
    cache_dtype: torch.dtype
    pos_dtype: torch.dtype
    cache_rows: int
    cache_layout: str  # "contiguous", "wide" (cache[:, :rot_dim] of a wider one), "every_other_row"
    edge_positions: bool  # also use positions 0 and cache_rows - 1
    stray: int  # tokens given out-of-range positions (only where the op leaves them untouched)
    entry: str  # "api" (rope_compat.rotary_embedding) or "op" (torch.ops.rope_compat...)
    seed: int


def draw_spec(c: Chooser, allow_stray: bool = False) -> FuzzSpec:
    """One random case. `allow_stray`: devices where out-of-range tokens are left untouched."""
    storage = c.choice(STORAGES)
    kv_heads = c.integer(1, 4)
    heads = kv_heads * c.choice((1, 1, 2, 3, 4))
    head_size = c.choice(HEAD_SIZES)
    rot_dim = head_size - head_size % 2 if c.choice((True, False)) else 2 * c.integer(1, head_size // 2)
    offset = 0 if c.choice((True, False)) else c.integer(0, head_size - rot_dim)
    # Fewer tokens for wide heads, so that every case stays small and quick.
    max_tokens = max(1, min(32, MAX_PARENT_ELEMENTS // ((heads + 2 * kv_heads) * head_size)))
    if c.choice((True, False)):
        tokens: Tuple[int, ...] = (c.integer(0, max_tokens),)
    else:
        batch = c.integer(1, min(4, max_tokens))
        tokens = (batch, c.integer(0, min(8, max_tokens // batch)))
    num_tokens = tokens[0] * (tokens[1] if len(tokens) == 2 else 1)
    return FuzzSpec(
        tokens=tokens,
        token_step=c.integer(1, 2),
        seq_pad=c.choice((0, 0, 1, 5)),
        storage=storage,
        heads_form=storage == "head_major" or c.choice((True, False)),
        lead=c.choice((0, 0, 1, 2, 8)),
        tail=c.choice((0, 3, 8)),
        heads=heads,
        kv_heads=kv_heads,
        with_key=c.choice((True, True, True, False)),
        head_size=head_size,
        rot_dim=rot_dim,
        rope_dim_offset=offset,
        is_neox=c.choice((True, False)),
        inverse=c.choice((False, False, True)),
        dtype=c.choice(DTYPES),
        cache_dtype=c.choice(CACHE_DTYPES),
        pos_dtype=c.choice((torch.int64, torch.int32)),
        cache_rows=min(c.choice(CACHE_ROWS), max(1, MAX_CACHE_ELEMENTS // rot_dim)),
        cache_layout=c.choice(("contiguous", "contiguous", "wide", "every_other_row")),
        edge_positions=c.choice((True, False)),
        stray=c.integer(0, min(num_tokens, 3)) if allow_stray else 0,
        entry=c.choice(("api", "op")),
        seed=c.integer(0, 2**32 - 1),
    )


# --- building the tensors -------------------------------------------------------------------


def _parent_token_shape(s: FuzzSpec) -> Tuple[int, ...]:
    shape = list(s.tokens)
    shape[0] *= s.token_step
    shape[-1] += s.seq_pad
    return tuple(shape)


def _token_index(s: FuzzSpec) -> tuple:
    first = slice(0, s.tokens[0] * s.token_step, s.token_step)
    return (first,) + tuple(slice(0, n) for n in s.tokens[1:])


def _parent_shapes(s: FuzzSpec) -> List[Tuple[int, ...]]:
    ptok = _parent_token_shape(s)
    d = s.head_size
    if s.storage == "fused":  # [q | k | v] per token, with padding around
        return [ptok + (s.lead + (s.heads + 2 * s.kv_heads) * d + s.tail,)]
    if s.storage == "separate":
        return [ptok + (s.lead + s.heads * d + s.tail,), ptok + (s.lead + s.kv_heads * d + s.tail,)]
    # head_major: [heads (+ one spare), *tokens, head_size (+ padding)], viewed as [*tokens, H, D]
    return [(s.heads + s.kv_heads + 1,) + ptok + (d + s.tail,)]


def views(s: FuzzSpec, parents: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """q and k as views into `parents` (any tensors of the shapes `_parent_shapes` gives)."""
    idx, d, h, kh = _token_index(s), s.head_size, s.heads, s.kv_heads
    if s.storage == "head_major":
        p = parents[0][(slice(None),) + idx + (slice(0, d),)].movedim(0, -2)
        q, k = p[..., :h, :], p[..., h : h + kh, :]
    else:
        qp, kp = (parents[0], parents[0]) if s.storage == "fused" else parents
        k_start = s.lead + (h * d if s.storage == "fused" else 0)
        q = qp[idx + (slice(s.lead, s.lead + h * d),)]
        k = kp[idx + (slice(k_start, k_start + kh * d),)]
        if s.heads_form:
            q, k = q.unflatten(-1, (h, d)), k.unflatten(-1, (kh, d))
    return q, (k if s.with_key else None)


def _as_heads(x: torch.Tensor, s: FuzzSpec) -> torch.Tensor:
    return x if x.dim() == len(s.tokens) + 2 else x.unflatten(-1, (-1, s.head_size))


def _cache(s: FuzzSpec, g: torch.Generator, device: str) -> torch.Tensor:
    """Values in [-1, 1], not cos/sin pairs of one angle: the op is linear in them, and drawing
    them directly keeps large caches cheap. Sliced on `device` (moving a strided view to
    another device would make it contiguous)."""
    rows = 2 * s.cache_rows if s.cache_layout == "every_other_row" else s.cache_rows
    width = s.rot_dim + 6 if s.cache_layout == "wide" else s.rot_dim
    cache = torch.empty(rows, width, dtype=s.cache_dtype).uniform_(-1, 1, generator=g).to(device)
    return cache[::2] if s.cache_layout == "every_other_row" else cache[:, : s.rot_dim]


def _positions(s: FuzzSpec, g: torch.Generator) -> Tuple[torch.Tensor, torch.Tensor]:
    """(positions, stray mask over the token dims)."""
    n, rows = int(torch.Size(s.tokens).numel()), s.cache_rows
    pos = torch.randint(0, rows, (n,), dtype=torch.int64, generator=g)
    if s.edge_positions and n > 0:
        picks = torch.randperm(n, generator=g)[: max(1, n // 3)]
        pos[picks] = torch.where(torch.rand(picks.numel(), generator=g) < 0.5, 0, rows - 1)
    stray = torch.zeros(n, dtype=torch.bool)
    if s.stray:
        big = torch.iinfo(s.pos_dtype).max
        bad = torch.tensor([rows, rows + 1, -1, -rows, big, -big - 1, 1 << 30], dtype=torch.int64)
        picks = torch.randperm(n, generator=g)[: s.stray]
        pos[picks] = bad[torch.randint(0, bad.numel(), (picks.numel(),), generator=g)]
        stray[picks] = True
    return pos.to(s.pos_dtype).reshape(s.tokens), stray.reshape(s.tokens)


@dataclass
class Outcome:
    spec: FuzzSpec
    actual: torch.Tensor  # rotated elements as the op left them, float64, CPU
    expected: torch.Tensor  # the reference for them
    changed_outside: int  # elements outside the rotated ones that are not bit-identical

    def max_error(self, tolerance: dict) -> float:
        """Largest |actual - expected| / (atol + rtol * |expected|): <= 1 passes."""
        if self.actual.numel() == 0:
            return 0.0
        err = (self.actual - self.expected).abs()
        return float((err / (tolerance["atol"] + tolerance["rtol"] * self.expected.abs())).max())


def run_spec(s: FuzzSpec, device: str) -> Outcome:
    """Build the case on the CPU (seeded), run the op on `device`, compare with the reference."""
    g = torch.Generator().manual_seed(s.seed)
    before = [torch.randn(shape, dtype=s.dtype, generator=g) for shape in _parent_shapes(s)]
    positions, stray = _positions(s, g)
    cache = _cache(s, g, device)
    parents = [p.to(device, copy=True) for p in before]
    q, k = views(s, parents)
    op: Callable = rope_compat.rotary_embedding if s.entry == "api" else torch.ops.rope_compat.rotary_embedding
    op(positions.to(device), q, k, s.head_size, cache, s.is_neox, s.rope_dim_offset, s.inverse)

    # Rotated elements: the rotated dims of every head of q and k, tokens with in-range positions.
    mask = [torch.zeros(p.shape, dtype=torch.bool) for p in before]
    expected = [p.double() for p in before]
    if positions.numel() > 0:  # (the reference needs at least one token)
        refs = rope_reference(
            positions.masked_fill(stray, 0), *views(s, before), s.head_size, cache, s.is_neox,
            s.rope_dim_offset, s.inverse,
        )
    else:
        refs = views(s, expected)
    for m, e, ref in zip(views(s, mask), views(s, expected), refs):
        if m is None:
            continue
        m = _as_heads(m, s)
        m[..., s.rope_dim_offset : s.rope_dim_offset + s.rot_dim] = True
        m[stray] = False
        e.copy_(ref)
    after = [p.cpu() for p in parents]
    changed = sum(int(((bits(a) != bits(b)) & ~m).sum()) for a, b, m in zip(after, before, mask))
    return Outcome(
        spec=s,
        actual=torch.cat([a[m].double() for a, m in zip(after, mask)]),
        expected=torch.cat([e[m] for e, m in zip(expected, mask)]),
        changed_outside=changed,
    )
