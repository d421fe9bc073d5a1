"""Hostile inputs: every rejected argument with its exception type, and the edge cases that
must not be rejected (out-of-range positions on accelerators, NaN/inf, empty and huge tensors).

Each rejection is checked through the public function, the registered op (the dispatcher,
as torch.compile and CUDA graphs call it) and fake tensors (what torch.compile traces with),
on every device, and q and k must come back unchanged. The tables here are the source of the
README's list of rejected inputs.
"""

import re
from dataclasses import dataclass, replace
from typing import Callable, Optional

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import rope_compat
from rope_compat.ops import torch_impl

from cases import Case, make_case, random_cache
from reference import rope_reference
from tolerances import TOLERANCES, assert_matches_reference

HEAD_SIZE, ROT_DIM, ROWS = 64, 32, 256


def _base(device: str) -> Case:
    return make_case(
        tokens=(6,), heads=4, kv_heads=2, head_size=HEAD_SIZE, rot_dim=ROT_DIM, cache_rows=ROWS,
        device=device,
    )


def _elsewhere(device: str) -> str:
    """A device other than `device` that needs no second accelerator."""
    return "meta" if device == "cpu" else "cpu"


def _strided_last(x: torch.Tensor) -> torch.Tensor:
    """`x`'s values with last-dim stride 2."""
    wide = torch.empty(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype, device=x.device)
    wide[..., ::2] = x
    return wide[..., ::2]


def _with(positions: torch.Tensor, index: int, value: int) -> torch.Tensor:
    out = positions.clone()
    out[index] = value
    return out


@dataclass(frozen=True)
class Rejection:
    id: str
    mutate: Callable[[Case, str], Case]  # (valid case, device) -> the bad one
    error: type
    match: str  # regex on the message
    needs_data: bool = False  # raised only where tensor data is read: CPU eager, not fake tensors


REJECTIONS = [
    # dtypes
    Rejection("positions float32", lambda c, d: replace(c, positions=c.positions.float()),
              TypeError, r"positions: expected dtype int32 or int64"),
    Rejection("positions int16", lambda c, d: replace(c, positions=c.positions.short()),
              TypeError, r"positions: expected dtype int32 or int64"),
    Rejection("query and key float64", lambda c, d: replace(c, query=c.query.double(), key=c.key.double()),
              TypeError, r"query: expected dtype float32, float16 or bfloat16"),
    Rejection("query and key int32", lambda c, d: replace(c, query=c.query.int(), key=c.key.int()),
              TypeError, r"query: expected dtype float32, float16 or bfloat16"),
    Rejection("key float16, query float32", lambda c, d: replace(c, key=c.key.half()),
              TypeError, r"key: dtype torch.float16 must equal query's dtype torch.float32"),
    Rejection("cos_sin_cache int32", lambda c, d: replace(c, cos_sin_cache=c.cos_sin_cache.int()),
              TypeError, r"cos_sin_cache: expected a float dtype"),
    # devices (CPU: 'meta' stands in for another device; CUDA: CPU tensors)
    Rejection("query on another device", lambda c, d: replace(c, query=c.query.to(_elsewhere(d))),
              ValueError, r"query: on device .*, but positions is on .*; all tensors must be on one device"),
    Rejection("key on another device", lambda c, d: replace(c, key=c.key.to(_elsewhere(d))),
              ValueError, r"key: on device .*, but positions is on"),
    Rejection("cache on another device",
              lambda c, d: replace(c, cos_sin_cache=c.cos_sin_cache.to(_elsewhere(d))),
              ValueError, r"cos_sin_cache: on device .*, but positions is on"),
    Rejection("positions on another device", lambda c, d: replace(c, positions=c.positions.to(_elsewhere(d))),
              ValueError, r"query: on device .*, but positions is on"),
    # shapes
    Rejection("positions 3-D", lambda c, d: replace(c, positions=c.positions.reshape(1, 2, 3)),
              ValueError, r"positions: expected shape \[num_tokens\] or \[batch, seq_len\]"),
    Rejection("positions 0-D", lambda c, d: replace(c, positions=c.positions[0]),
              ValueError, r"positions: expected shape \[num_tokens\] or \[batch, seq_len\]"),
    Rejection("query has one token more", lambda c, d: replace(c, query=torch.cat([c.query, c.query[:1]])),
              ValueError, r"query: leading dims"),
    Rejection("key has one token less", lambda c, d: replace(c, key=c.key[1:]),
              ValueError, r"key: leading dims"),
    Rejection("query [T, H*D] for positions [B, S]",
              lambda c, d: replace(c, positions=c.positions.reshape(2, 3)),
              ValueError, r"query: expected 3 dims \[\*positions.shape, heads \* head_size\] or 4 dims"),
    Rejection("query 4-D for positions [T]",
              lambda c, d: replace(c, query=c.query.reshape(6, 2, 2, HEAD_SIZE)),
              ValueError, r"query: expected 2 dims .* or 3 dims"),
    Rejection("hidden size not divisible by head_size",
              lambda c, d: replace(c, query=c.query[:, : 3 * HEAD_SIZE + 32]),
              ValueError, r"query: hidden size 224 is not divisible by head_size=64"),
    Rejection("query [T, H, D] with D != head_size",
              lambda c, d: replace(c, query=c.query.reshape(6, 8, HEAD_SIZE // 2)),
              ValueError, r"query: last dim is 32, expected head_size=64"),
    Rejection("key 4-D for positions [T]",
              lambda c, d: replace(c, key=c.key.reshape(6, 2, 1, HEAD_SIZE)),
              ValueError, r"key: expected 2 dims .* or 3 dims"),
    Rejection("key hidden size not divisible by head_size",
              lambda c, d: replace(c, key=c.key[:, : HEAD_SIZE + 32]),
              ValueError, r"key: hidden size 96 is not divisible by head_size=64"),
    Rejection("key [T, H, D] with D != head_size",
              lambda c, d: replace(c, key=c.key.reshape(6, 4, HEAD_SIZE // 2)),
              ValueError, r"key: last dim is 32, expected head_size=64"),
    Rejection("query heads not a multiple of key heads",
              lambda c, d: replace(c, key=torch.cat([c.key, c.key[:, :HEAD_SIZE]], -1)),
              ValueError, r"key: query heads \(4\) must be a multiple of key heads \(3\)"),
    Rejection("more key heads than query heads",
              lambda c, d: replace(c, query=c.query[:, : 1 * HEAD_SIZE]),
              ValueError, r"key: query heads \(1\) must be a multiple of key heads \(2\)"),
    Rejection("key with zero heads", lambda c, d: replace(c, key=c.key[:, :0]),
              ValueError, r"key: query heads \(4\) must be a multiple of key heads \(0\)"),
    Rejection("cache 1-D", lambda c, d: replace(c, cos_sin_cache=c.cos_sin_cache.reshape(-1)),
              ValueError, r"cos_sin_cache: expected 2 dims \[max_position, rot_dim\]"),
    Rejection("cache 3-D", lambda c, d: replace(c, cos_sin_cache=c.cos_sin_cache.reshape(ROWS, 2, -1)),
              ValueError, r"cos_sin_cache: expected 2 dims \[max_position, rot_dim\]"),
    Rejection("odd rot_dim", lambda c, d: replace(c, cos_sin_cache=c.cos_sin_cache[:, :31]),
              ValueError, r"cos_sin_cache: rot_dim \(size of dim 1\) must be even and positive, got 31"),
    Rejection("rot_dim 0", lambda c, d: replace(c, cos_sin_cache=c.cos_sin_cache[:, :0]),
              ValueError, r"cos_sin_cache: rot_dim \(size of dim 1\) must be even and positive, got 0"),
    Rejection("rot_dim > head_size",
              lambda c, d: replace(c, cos_sin_cache=random_cache(ROWS, 80, torch.float32, d)),
              ValueError, r"rope_dim_offset \+ rot_dim = 0 \+ 80 exceeds head_size=64"),
    Rejection("rot_dim + offset > head_size", lambda c, d: replace(c, rope_dim_offset=40),
              ValueError, r"rope_dim_offset \+ rot_dim = 40 \+ 32 exceeds head_size=64"),
    Rejection("negative rope_dim_offset", lambda c, d: replace(c, rope_dim_offset=-2),
              ValueError, r"rope_dim_offset: must be >= 0, got -2"),
    Rejection("head_size 0", lambda c, d: replace(c, head_size=0),
              ValueError, r"head_size: must be positive, got 0"),
    Rejection("head_size negative", lambda c, d: replace(c, head_size=-64),
              ValueError, r"head_size: must be positive, got -64"),
    # strides
    Rejection("query last dim not contiguous", lambda c, d: replace(c, query=_strided_last(c.query)),
              ValueError, r"query: last dim must be contiguous \(stride 1\), got stride 2"),
    Rejection("key last dim not contiguous", lambda c, d: replace(c, key=_strided_last(c.key)),
              ValueError, r"key: last dim must be contiguous \(stride 1\), got stride 2"),
    Rejection("cache last dim not contiguous",
              lambda c, d: replace(c, cos_sin_cache=_strided_last(c.cos_sin_cache)),
              ValueError, r"cos_sin_cache: last dim must be contiguous \(stride 1\)"),
    Rejection("positions not contiguous",
              lambda c, d: replace(c, positions=c.positions.reshape(3, 2).t(),
                                   query=c.query.reshape(3, 2, -1).transpose(0, 1),
                                   key=c.key.reshape(3, 2, -1).transpose(0, 1)),
              ValueError, r"positions: must be contiguous"),
    # position bounds: the CPU raises before anything is written (accelerators: test_bounds_*)
    Rejection("out of bounds: position == cache rows", lambda c, d: replace(c, positions=_with(c.positions, 3, ROWS)),
              IndexError, r"positions: cache rows must lie in \[0, 256\), got values in \[.*, 256\]", needs_data=True),
    Rejection("out of bounds: negative position", lambda c, d: replace(c, positions=_with(c.positions, 0, -1)),
              IndexError, r"positions: cache rows must lie in \[0, 256\), got values in \[-1, ", needs_data=True),
    Rejection("out of bounds: int64 position 2**62",
              lambda c, d: replace(c, positions=_with(c.positions, 5, 2**62)),
              IndexError, r"positions: cache rows must lie in \[0, 256\)", needs_data=True),
    Rejection("out of bounds: empty cache", lambda c, d: replace(c, cos_sin_cache=c.cos_sin_cache[:0]),
              IndexError, r"positions: cache rows must lie in \[0, 0\)", needs_data=True),
]


ENTRIES = ("function", "op", "fake")


def _call(entry: str, args: tuple, batched: bool = False) -> None:
    if entry == "function":
        (rope_compat.batched_rotary_embedding if batched else rope_compat.rotary_embedding)(*args)
        return
    op = torch.ops.rope_compat.batched_rotary_embedding if batched else torch.ops.rope_compat.rotary_embedding
    if entry == "op":
        op(*args)
        return
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])


def _snapshot(*tensors: Optional[torch.Tensor]) -> list:
    return [None if t is None or t.is_meta else t.clone() for t in tensors]


def _assert_unchanged(tensors, snapshot) -> None:
    for t, before in zip(tensors, snapshot):
        if before is not None:
            assert torch.equal(t, before), "a rejected call changed its input"


def _skip_fake_data_check(entry: str, needs_data: bool, device: str) -> None:
    if needs_data and (entry == "fake" or device != "cpu"):
        pytest.skip("positions are bounds-checked only where their data is read: eager CPU calls")


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("row", REJECTIONS, ids=lambda r: r.id)
def test_rejected(row: Rejection, entry: str, device: str):
    _skip_fake_data_check(entry, row.needs_data, device)
    case = row.mutate(_base(device), device)
    before = _snapshot(case.query, case.key)
    with pytest.raises(row.error, match=row.match):
        _call(entry, case.args())
    _assert_unchanged((case.query, case.key), before)


# Under torch.compile the checks run at trace time on fake tensors; Dynamo reports the
# exception wrapped in its TorchRuntimeError (a RuntimeError) with the original type and message
# in its text. One row per kind of check keeps the traces few.
COMPILE_ROWS = ("positions float32", "query and key float64", "positions 3-D", "rot_dim > head_size",
                "query last dim not contiguous", "head_size 0")


@pytest.mark.parametrize("row", [r for r in REJECTIONS if r.id in COMPILE_ROWS], ids=lambda r: r.id)
def test_rejected_under_torch_compile(row: Rejection, device: str):
    from torch._dynamo.exc import TorchRuntimeError

    case = row.mutate(_base(device), device)
    before = _snapshot(case.query, case.key)
    compiled = torch.compile(rope_compat.rotary_embedding, backend="eager", fullgraph=True)
    torch._dynamo.reset()
    try:
        with pytest.raises(TorchRuntimeError) as exc:
            compiled(*case.args())
    finally:
        torch._dynamo.reset()
    assert f"{row.error.__name__}(" in str(exc.value)
    assert re.search(row.match, str(exc.value)), str(exc.value)
    _assert_unchanged((case.query, case.key), before)


# --- batched_rotary_embedding (vLLM's former multi-LoRA op) -------------------------------------


def _batched_base(device: str) -> dict:
    c = _base(device)
    offsets = torch.randint(0, ROWS // 2, (6,), device=device)
    return dict(positions=c.positions % (ROWS // 2), query=c.query, key=c.key, head_size=HEAD_SIZE,
                cos_sin_cache=c.cos_sin_cache, is_neox=True, rot_dim=ROT_DIM, cos_sin_cache_offsets=offsets)


BATCHED_REJECTIONS = [
    Rejection("rot_dim != cache dim 1", lambda a, d: {**a, "rot_dim": 16},
              ValueError, r"rot_dim: 16 must equal cos_sin_cache.shape\[1\] = 32"),
    Rejection("offsets float32", lambda a, d: {**a, "cos_sin_cache_offsets": a["cos_sin_cache_offsets"].float()},
              TypeError, r"cos_sin_cache_offsets: expected dtype int32 or int64"),
    Rejection("offsets of another count", lambda a, d: {**a, "cos_sin_cache_offsets": a["cos_sin_cache_offsets"][:5]},
              ValueError, r"cos_sin_cache_offsets: expected a contiguous tensor of 6 elements"),
    Rejection("offsets not contiguous",
              lambda a, d: {**a, "cos_sin_cache_offsets": a["cos_sin_cache_offsets"].repeat(2)[::2]},
              ValueError, r"cos_sin_cache_offsets: expected a contiguous tensor of 6 elements"),
    Rejection("offsets on another device",
              lambda a, d: {**a, "cos_sin_cache_offsets": a["cos_sin_cache_offsets"].to(_elsewhere(d))},
              ValueError, r"cos_sin_cache_offsets: on device .*, but positions is on"),
    Rejection("out of bounds: offset + position == cache rows",
              lambda a, d: {**a, "cos_sin_cache_offsets": _with(a["cos_sin_cache_offsets"], 2, ROWS - int(a["positions"][2]))},
              IndexError, r"positions: cache rows must lie in \[0, 256\)", needs_data=True),
]


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("row", BATCHED_REJECTIONS, ids=lambda r: r.id)
def test_batched_rejected(row: Rejection, entry: str, device: str):
    _skip_fake_data_check(entry, row.needs_data, device)
    args = row.mutate(_batched_base(device), device)
    before = _snapshot(args["query"], args["key"])
    with pytest.raises(row.error, match=row.match):
        _call(entry, tuple(args.values()), batched=True)
    _assert_unchanged((args["query"], args["key"]), before)


# --- NaN and inf: IEEE arithmetic, never an error -----------------------------------------------


def _assert_ieee_matches(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """NaN where the reference is NaN, the same infinity where it is infinite, close elsewhere."""
    actual, expected = actual.cpu(), expected.cpu()
    assert torch.equal(actual.isnan(), expected.isnan()), "NaN at other places than the reference"
    inf = expected.isinf()
    assert torch.equal(actual.double()[inf], expected[inf]), "infinities differ from the reference"
    finite = expected.isfinite()
    torch.testing.assert_close(
        actual.double()[finite], expected[finite], **TOLERANCES[actual.dtype]
    )


def _sprinkle(x: torch.Tensor, generator: torch.Generator) -> None:
    """Put NaN, +inf and -inf at random elements of `x` (about 1 in 50 each)."""
    u = torch.rand(x.shape, generator=generator).to(x.device)
    x[u < 0.02] = float("nan")
    x[(u >= 0.02) & (u < 0.04)] = float("inf")
    x[(u >= 0.04) & (u < 0.06)] = float("-inf")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("where", ["query_key", "cache"])
def test_nan_and_inf_follow_ieee(where: str, is_neox: bool, dtype: torch.dtype, device: str):
    g = torch.Generator().manual_seed(7)
    # Partial rotation with an offset: the pass-through dims hold NaN/inf too and must keep
    # their exact bits (NaN payloads included).
    case = make_case(
        tokens=(3, 17), heads=4, kv_heads=2, head_size=64, rot_dim=32, rope_dim_offset=16,
        is_neox=is_neox, dtype=dtype, layout="fused_heads", cache_rows=64, device=device,
    )
    targets = (case.query, case.key) if where == "query_key" else (case.cos_sin_cache,)
    for t in targets:
        _sprinkle(t, g)
    want_q, want_k = rope_reference(*case.args())
    before_q, before_k = case.query.clone(), case.key.clone()
    rope_compat.rotary_embedding(*case.args())
    for got, want, before in ((case.query, want_q, before_q), (case.key, want_k, before_k)):
        rotated = slice(16, 48)
        _assert_ieee_matches(got[..., rotated], want[..., rotated])
        for kept in (slice(0, 16), slice(48, 64)):
            assert torch.equal(got[..., kept].view(torch.uint8), before[..., kept].view(torch.uint8))


# --- empty tensors: legal, nothing to do -------------------------------------------------------


@pytest.mark.parametrize(
    "tokens, heads, kv_heads, with_key",
    [
        ((0,), 4, 2, True),  # no tokens
        ((0, 5), 4, 2, True),  # no sequences
        ((3, 0), 4, 2, True),  # empty sequences
        ((5,), 0, 0, False),  # no query heads, no key
    ],
    ids=["zero tokens", "batch 0", "seq_len 0", "zero query heads, no key"],
)
@pytest.mark.parametrize("layout", ["flat", "heads"])
def test_empty_inputs_are_a_no_op(tokens, heads, kv_heads, with_key, layout, device):
    """Legal: both entry points return without an error (and there is nothing to write)."""
    case = make_case(
        tokens=tokens, heads=heads, kv_heads=kv_heads, head_size=64, layout=layout,
        with_key=with_key, device=device,
    )
    assert rope_compat.rotary_embedding(*case.args()) is None
    assert torch.ops.rope_compat.rotary_embedding(*case.args()) is None


def test_empty_tokens_with_empty_cache(device):
    case = make_case(tokens=(0,), device=device)
    case = replace(case, cos_sin_cache=case.cos_sin_cache[:0])
    rope_compat.rotary_embedding(*case.args())
    torch.ops.rope_compat.rotary_embedding(*case.args())


@pytest.mark.parametrize("layout", ["flat", "heads"])
def test_zero_query_heads_still_rotates_key(layout, device):
    # 0 query heads is a multiple of any number of key heads: legal, and the key rotates.
    case = make_case(tokens=(5,), heads=0, kv_heads=2, head_size=64, layout=layout, device=device)
    _, want_k = rope_reference(*case.args())
    rope_compat.rotary_embedding(*case.args())
    assert_matches_reference(case.key, want_k)


# --- position bounds on accelerators: out-of-range tokens are left untouched -------------------


def _bounds_positions(pos_dtype: torch.dtype, rows: int, device: str) -> torch.Tensor:
    """In-range positions (0 and rows - 1 included) mixed with out-of-range ones."""
    big, small = torch.iinfo(pos_dtype).max, torch.iinfo(pos_dtype).min
    stray = [rows, rows + 1, -1, -rows, big, small, big // 2 + 3]
    if pos_dtype == torch.int64:
        stray += [2**62, -(2**62), 2**32, 2**32 + 1]  # also rows that wrap in 32 bits
    legal = [0, rows - 1] + torch.randint(0, rows, (len(stray) + 5,)).tolist()
    values = torch.tensor(legal + stray, dtype=pos_dtype)
    return values[torch.randperm(values.numel())].to(device)


def _impl(name: str) -> Callable:
    """'kernel': the public function (the CUDA kernel where built); 'torch': the Torch fallback."""
    return rope_compat.rotary_embedding if name == "kernel" else torch_impl.rotary_embedding


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["kernel", "torch"])
@pytest.mark.parametrize("pos_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 37, 4096])
def test_bounds_cuda_out_of_range_tokens_untouched(rows, dtype, is_neox, pos_dtype, impl):
    _check_out_of_range_tokens_untouched(_impl(impl), "cuda", rows, dtype, is_neox, pos_dtype)


# The Torch fallback on an accelerator gathers without a host-side bounds check (identity
# rotation for rows outside the cache). That path is chosen by device; here it runs on CPU.
@pytest.mark.parametrize("pos_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rows", [1, 37])
def test_bounds_torch_accelerator_path_on_cpu(rows, is_neox, pos_dtype, monkeypatch):
    monkeypatch.setattr(torch_impl, "_cache_rows_checked", torch_impl._cache_rows_or_identity)
    _check_out_of_range_tokens_untouched(torch_impl.rotary_embedding, "cpu", rows, torch.bfloat16,
                                         is_neox, pos_dtype)


def test_bounds_torch_accelerator_path_on_cpu_empty_cache(monkeypatch):
    monkeypatch.setattr(torch_impl, "_cache_rows_checked", torch_impl._cache_rows_or_identity)
    q, k = torch.randn(9, 4 * 64), torch.randn(9, 2 * 64)
    before_q, before_k = q.clone(), k.clone()
    torch_impl.rotary_embedding(torch.arange(9), q, k, 64, torch.empty(0, 64), True)
    assert torch.equal(q, before_q) and torch.equal(k, before_k)


def _check_out_of_range_tokens_untouched(rotate: Callable, device: str, rows: int, dtype: torch.dtype,
                                         is_neox: bool, pos_dtype: torch.dtype) -> None:
    positions = _bounds_positions(pos_dtype, rows, device)
    n = positions.numel()
    # q and k inside one fused tensor, so a stray write anywhere in it is seen; the cache is
    # its own allocation, exactly rows x rot_dim, so a memory checker sees any read past it.
    qkv = torch.randn(n, (8 + 2 * 2) * 64 + 8, dtype=dtype, device=device)
    q, k = qkv[:, : 8 * 64], qkv[:, 8 * 64 : 10 * 64]
    cache = random_cache(rows, 64, torch.float32, device)
    before = qkv.clone()
    inside = (positions >= 0) & (positions < rows)
    want_q, want_k = rope_reference(positions.clamp(0, rows - 1), q, k, 64, cache, is_neox)

    rotate(positions, q, k, 64, cache, is_neox)
    if device == "cuda":
        torch.cuda.synchronize()

    assert torch.equal(qkv[~inside], before[~inside]), "an out-of-range token was written"
    assert torch.equal(qkv[:, 10 * 64 :], before[:, 10 * 64 :]), "v or the padding was written"
    assert_matches_reference(q[inside], want_q[inside.cpu()])
    assert_matches_reference(k[inside], want_k[inside.cpu()])


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["kernel", "torch"])
def test_bounds_cuda_empty_cache_leaves_everything(impl):
    q = torch.randn(9, 4 * 64, device="cuda")
    k = torch.randn(9, 2 * 64, device="cuda")
    before_q, before_k = q.clone(), k.clone()
    positions = torch.arange(9, device="cuda")
    _impl(impl)(positions, q, k, 64, torch.empty(0, 64, device="cuda"), True)
    torch.cuda.synchronize()
    assert torch.equal(q, before_q) and torch.equal(k, before_k)


@pytest.mark.gpu
@pytest.mark.parametrize("entry", ["function", "op"])
def test_bounds_cuda_batched_offsets(entry):
    rows = 64
    positions = torch.tensor([0, 5, 63, 10, 3, 1, 60, 2, 7], device="cuda")
    # offset + position: 0, == rows, past the end, negative, rows - 1, 1, == rows, 0, 2**40
    offsets = torch.tensor([0, 59, 5, -11, 60, 0, 4, -2, 2**40], device="cuda")
    inside = ((positions + offsets) >= 0) & ((positions + offsets) < rows)
    q = torch.randn(9, 4, 64, device="cuda")
    k = torch.randn(9, 2, 64, device="cuda")
    cache = random_cache(rows, 32, torch.float32, "cuda")
    before_q, before_k = q.clone(), k.clone()
    want_q, want_k = rope_reference((positions + offsets).clamp(0, rows - 1), q, k, 64, cache, True)
    _call(entry, (positions, q, k, 64, cache, True, 32, offsets), batched=True)
    torch.cuda.synchronize()
    assert torch.equal(q[~inside], before_q[~inside]) and torch.equal(k[~inside], before_k[~inside])
    assert_matches_reference(q[inside], want_q[inside.cpu()])
    assert_matches_reference(k[inside], want_k[inside.cpu()])


# --- more than 2**31 elements --------------------------------------------------------------------


@pytest.mark.gpu
def test_huge_cuda_query_past_2_31_elements():
    heads, head_size = 32, 128
    width = heads * head_size
    tokens = (1 << 31) // width + 3  # the last 3 tokens lie past element 2**31 of q
    need = tokens * width * 2 + (1 << 30)  # q in bf16, plus room for everything else
    if torch.cuda.mem_get_info()[0] < need:
        pytest.skip(f"needs {need / 2**30:.1f} GiB of free GPU memory")
    positions = torch.randint(0, 8192, (tokens,), device="cuda")
    q = torch.randn(tokens, width, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(tokens, head_size, dtype=torch.bfloat16, device="cuda")  # one kv head
    cache = random_cache(8192, head_size, torch.float32, "cuda")
    sample = torch.cat([
        torch.tensor([0, 1, tokens // 2, (1 << 31) // width - 1, tokens - 3, tokens - 2, tokens - 1]),
        torch.randint(0, tokens, (16,)),
    ]).cuda()
    want_q, want_k = rope_reference(positions[sample], q[sample], k[sample], head_size, cache, True)
    try:
        rope_compat.rotary_embedding(positions, q, k, head_size, cache, True)
        assert_matches_reference(q[sample], want_q)
        assert_matches_reference(k[sample], want_k)
    finally:
        del q, k
        torch.cuda.empty_cache()
