"""Bad arguments raise the documented Python exception, naming the argument, before any write.

The same tests hold on every device: on CUDA the compiled kernel checks in C++ and raises
the same Python types (see rope_compat/ops/checks.py).
"""

import pytest
import torch

import rope_compat
from cases import make_case


def _case(device, **kw):
    kw.setdefault("cache_rows", 32)
    return make_case(tokens=(6,), heads=4, kv_heads=2, head_size=64, device=device, **kw)


def _args(device):
    """rotary_embedding's arguments, valid, as a dict."""
    c = _case(device)
    return dict(
        positions=c.positions, query=c.query, key=c.key, head_size=c.head_size,
        cos_sin_cache=c.cos_sin_cache, is_neox=True, rope_dim_offset=0, inverse=False,
    )


# name: (exception type, text the message must contain, replacements given (valid args, device))
BAD = {
    "token_count_query": (ValueError, "query", lambda a, d: dict(query=a["query"][:5])),
    "token_count_key": (ValueError, "key", lambda a, d: dict(key=a["key"][:4])),
    "hidden_not_divisible": (ValueError, "query", lambda a, d: dict(query=a["query"][:, :200])),
    "head_dim_not_head_size": (
        ValueError, "query", lambda a, d: dict(query=a["query"].unflatten(-1, (-1, 32)))
    ),
    "q_heads_not_multiple": (ValueError, "key", lambda a, d: dict(key=torch.randn(6, 3 * 64, device=d))),
    "rot_dim_plus_offset": (ValueError, "rope_dim_offset", lambda a, d: dict(rope_dim_offset=2)),
    "rot_dim_too_large": (
        ValueError, "rot_dim", lambda a, d: dict(cos_sin_cache=torch.randn(32, 66, device=d))
    ),
    "odd_rot_dim": (ValueError, "rot_dim", lambda a, d: dict(cos_sin_cache=torch.randn(32, 31, device=d))),
    "negative_offset": (ValueError, "rope_dim_offset", lambda a, d: dict(rope_dim_offset=-2)),
    "qk_dtype_mismatch": (TypeError, "key", lambda a, d: dict(key=a["key"].half())),
    "integer_query": (
        TypeError, "query", lambda a, d: dict(query=torch.ones(6, 256, dtype=torch.int32, device=d))
    ),
    "double_query": (TypeError, "query", lambda a, d: dict(query=a["query"].double())),
    "integer_cache": (
        TypeError, "cos_sin_cache",
        lambda a, d: dict(cos_sin_cache=torch.ones(32, 64, dtype=torch.int64, device=d)),
    ),
    "float_positions": (TypeError, "positions", lambda a, d: dict(positions=a["positions"].float())),
    "int16_positions": (
        TypeError, "positions", lambda a, d: dict(positions=a["positions"].to(torch.int16))
    ),
    "query_strided_last_dim": (
        ValueError, "query", lambda a, d: dict(query=torch.randn(6, 512, device=d)[:, ::2])
    ),
    "key_strided_last_dim": (
        ValueError, "key", lambda a, d: dict(key=torch.randn(6, 256, device=d)[:, ::2])
    ),
    "cache_1d": (ValueError, "cos_sin_cache", lambda a, d: dict(cos_sin_cache=a["cos_sin_cache"].flatten())),
    "cache_3d": (ValueError, "cos_sin_cache", lambda a, d: dict(cos_sin_cache=a["cos_sin_cache"][None])),
    "head_size_zero": (ValueError, "head_size", lambda a, d: dict(head_size=0)),
    "head_size_negative": (ValueError, "head_size", lambda a, d: dict(head_size=-64)),
    "positions_3d": (ValueError, "positions", lambda a, d: dict(positions=a["positions"].view(1, 2, 3))),
    "positions_0d": (ValueError, "positions", lambda a, d: dict(positions=a["positions"][0])),
    "query_3_token_dims": (ValueError, "query", lambda a, d: dict(query=a["query"].view(6, 2, 2, 64))),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_argument_raises_before_writing(device, name):
    exc, argument, replacements = BAD[name]
    args = _args(device)
    args.update(replacements(args, device))
    q_before = args["query"].clone()
    k_before = args["key"].clone()
    with pytest.raises(exc, match=argument):
        rope_compat.rotary_embedding(**args)
    assert torch.equal(args["query"], q_before), "query was written before the error"
    assert torch.equal(args["key"], k_before), "key was written before the error"


@pytest.mark.parametrize("moved", ["query", "key", "cos_sin_cache", "positions"])
def test_tensors_on_different_devices(device, moved):
    """One tensor on another device (the meta device stands in for a second device)."""
    args = _args(device)
    other = "meta" if device == "cpu" else "cpu"
    args[moved] = args[moved].to(other)
    snapshot = {k: args[k].clone() for k in ("query", "key") if args[k].device.type != "meta"}
    with pytest.raises(ValueError, match="device"):
        rope_compat.rotary_embedding(**args)
    for k, before in snapshot.items():
        assert torch.equal(args[k], before)


@pytest.mark.parametrize("bad_position", [-1, 32, 10**6])
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64], ids=str)
def test_positions_out_of_range(device, bad_position, pos_dtype):
    """CPU: IndexError before any write. Other devices: no host sync, the token is skipped."""
    case = _case(device, pos_dtype=pos_dtype)
    case.positions[3] = bad_position
    q_before, k_before = case.query.clone(), case.key.clone()
    if device == "cpu":
        with pytest.raises(IndexError, match="positions"):
            rope_compat.rotary_embedding(*case.args())
        assert torch.equal(case.query, q_before) and torch.equal(case.key, k_before)
    else:
        rope_compat.rotary_embedding(*case.args())
        assert torch.equal(case.query[3], q_before[3]) and torch.equal(case.key[3], k_before[3])
        assert not torch.equal(case.query[2], q_before[2])


def test_empty_cache_on_cpu():
    case = _case("cpu")
    q_before = case.query.clone()
    with pytest.raises(IndexError, match="positions"):
        rope_compat.rotary_embedding(case.positions, case.query, case.key, 64, case.cos_sin_cache[:0], True)
    assert torch.equal(case.query, q_before)


def test_batched_offsets_out_of_range_on_cpu():
    case = _case("cpu")
    offsets = torch.zeros(6, dtype=torch.int64)
    offsets[5] = 32  # positions + offsets past the last cache row
    q_before = case.query.clone()
    with pytest.raises(IndexError, match="positions"):
        rope_compat.batched_rotary_embedding(
            case.positions, case.query, case.key, 64, case.cos_sin_cache, True, 64, offsets
        )
    assert torch.equal(case.query, q_before)


@pytest.mark.parametrize(
    "offsets,exc",
    [(torch.zeros(5, dtype=torch.int64), ValueError), (torch.zeros(6), TypeError)],
    ids=["wrong_length", "float"],
)
def test_batched_bad_offsets(device, offsets, exc):
    case = _case(device)
    with pytest.raises(exc, match="cos_sin_cache_offsets"):
        rope_compat.batched_rotary_embedding(
            case.positions, case.query, case.key, 64, case.cos_sin_cache, True, 64, offsets.to(device)
        )
