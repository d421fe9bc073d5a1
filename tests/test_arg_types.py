"""Argument types, and one message per rejection on every path.

A fuzz of argument types (not values) over the public functions and the registered ops: each
wrong type gets a TypeError that names the argument and what was expected, before anything is
written, with the same text from the Torch implementation, the public function and (on CUDA)
the compiled entry points `launch`, `batched_launch` and `set_kv_launch`.

The registered op is called through the dispatcher, which converts arguments by schema before
any kernel runs: what it cannot convert it rejects with its own RuntimeError naming the
argument and the schema type; None for a tensor reaches the checks and gets their TypeError;
some values it converts (None or a float to a bool, a one-element tensor to a number), so the
call is a valid one. Those three outcomes are what the op entry allows.

Then every value rejection of test_hostile_inputs (and of the fused store) must produce the
identical type and message through the Torch implementation, the public function, the op and
fake tensors; on CUDA through the compiled entry point, the public function and the op, and
identical to the CPU text where the message names no device.
"""

import re
from typing import Callable, Dict, List, Optional

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import rope_compat
from rope_compat.ops import extension, kv_store, library, torch_impl

from cases import make_case
from test_hostile_inputs import BATCHED_REJECTIONS, REJECTIONS, _base, _batched_base

T, OPT_T, INT, BOOL, OPT_FLOAT = "tensor", "tensor or None", "int", "bool", "float or None"
EXPECTED = {
    T: "a torch.Tensor", OPT_T: "a torch.Tensor or None", INT: "an int (64-bit)", BOOL: "a bool",
    OPT_FLOAT: "a float or None",
}

# name, kind for each argument, in order.
ROTARY = [("positions", T), ("query", T), ("key", OPT_T), ("head_size", INT), ("cos_sin_cache", T),
          ("is_neox", BOOL), ("rope_dim_offset", INT), ("inverse", BOOL)]
BATCHED = ROTARY[:6] + [("rot_dim", INT), ("cos_sin_cache_offsets", T)]
SET_KV = ROTARY[:2] + [("key", T)] + ROTARY[3:6] + [
    ("value", T), ("k_buffer", T), ("v_buffer", T), ("cache_loc", T), ("k_scale", OPT_FLOAT),
    ("v_scale", OPT_FLOAT), ("rope_dim_offset", INT)]


def _wrong_values(kind: str, good) -> List:
    """Values of other types than `kind` accepts (never a valid one)."""
    array = good.cpu().numpy() if isinstance(good, torch.Tensor) else np.zeros(3)
    common = ["x", [1, 2], (3,), array, object()]
    if kind == T:
        return [None, 3, 2.5] + common
    if kind == OPT_T:
        return [3, 2.5, True] + common
    if kind == INT:
        return [64.0, None, 2**70, torch.tensor(64.0), np.float32(2.0)] + common
    if kind == BOOL:
        return [None, 1.5, np.int8(1), torch.tensor(True)] + common
    return ["1.0", torch.tensor(1.0)] + common  # OPT_FLOAT


def _rotary_args(device):
    c = _base(device)
    return list(c.args())


def _batched_args(device):
    return list(_batched_base(device).values())


def _set_kv_args(device):
    c = make_case(tokens=(6,), heads=4, kv_heads=2, head_size=32, cache_rows=64, device=device)
    return [c.positions, c.query, c.key, 32, c.cos_sin_cache, True, torch.randn_like(c.key),
            torch.zeros(12, 64, device=device), torch.zeros(12, 64, device=device),
            torch.arange(6, device=device), None, None, 0]


def _direct(name: str) -> Optional[Callable]:
    C = extension.direct_binding()
    return None if C is None else getattr(C, name)


# per op: (argument spec, valid args, {entry: callable}, entries allowed the dispatcher's outcomes)
def _entries(op: str) -> Dict[str, Callable]:
    if op == "rotary_embedding":
        return {
            "function": rope_compat.rotary_embedding,
            "inplace alias": rope_compat.apply_rope_with_cos_sin_cache_inplace,
            "torch_impl": torch_impl.rotary_embedding,
            "op": torch.ops.rope_compat.rotary_embedding,
            "launch": _direct("launch"),
        }
    if op == "batched_rotary_embedding":
        return {
            "function": rope_compat.batched_rotary_embedding,
            "torch_impl": library._batched_torch,
            "op": torch.ops.rope_compat.batched_rotary_embedding,
            "launch": _direct("batched_launch"),
        }
    return {
        "function": rope_compat.rotary_embedding_set_kv,
        "torch_impl": kv_store.rotary_embedding_set_kv,
        "op": torch.ops.rope_compat.rotary_embedding_set_kv,
        "launch": _direct("set_kv_launch"),
    }


OPS = {"rotary_embedding": (ROTARY, _rotary_args), "batched_rotary_embedding": (BATCHED, _batched_args),
       "rotary_embedding_set_kv": (SET_KV, _set_kv_args)}

FUZZ = [(op, i, j) for op, (spec, _) in OPS.items() for i, (_, kind) in enumerate(spec)
        for j in range(len(_wrong_values(kind, torch.zeros(1))))]


def _tensors(args) -> list:
    return [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point() and a.device.type != "meta"]


def _outcome(call, args):
    """(exception type, message) of call(*args), or None if it returned."""
    try:
        call(*args)
    except Exception as e:  # noqa: BLE001 - the test compares what was raised
        return type(e), str(e)
    return None


@pytest.mark.parametrize("op, index, which", FUZZ, ids=lambda v: str(v))
def test_wrong_argument_type(op, index, which, device):
    spec, make_args = OPS[op]
    name, kind = spec[index]
    args = make_args(device)
    bad = _wrong_values(kind, args[index])[which]
    if device == "cuda" and isinstance(bad, torch.Tensor):
        bad = bad.cuda()
    args[index] = bad
    entries_args = args
    want = (TypeError, f"{name}: expected {EXPECTED[kind]}, got {type(bad).__name__}")
    for entry, call in _entries(op).items():
        if call is None or (entry == "launch" and device != "cuda"):
            continue
        if entry == "inplace alias" and index > 5:
            continue  # its 7th and 8th arguments are the fused store and enable_pdl
        call_args = entries_args[:6] if entry == "inplace alias" else entries_args
        snapshot = [t.clone() for t in _tensors(entries_args)]
        got = _outcome(call, call_args)
        if got is not None:
            for t, before in zip(_tensors(entries_args), snapshot):
                assert torch.equal(t, before), f"{entry}: wrote before rejecting {name}"
        if entry == "op" and got != want:
            # The dispatcher's own conversion: its RuntimeError names the argument, or it
            # converts the value (a bool from None, a float from a tensor), and the call is
            # then a valid one.
            if got is None or got[0] is ValueError:  # converted, then valid or a value error
                assert kind in (BOOL, OPT_FLOAT, INT), f"op converted {bad!r} for {name}: {got}"
                continue
            assert got[0] is RuntimeError and f"for argument '{name}'" in got[1], (entry, got)
            continue
        assert got == want, f"{entry}: {got} != {want}"


def test_wrong_type_messages_name_short_type():
    """The message names the type as type(x).__name__ does (numpy's ndarray, not its module)."""
    args = _rotary_args("cpu")
    args[1] = args[1].numpy()
    with pytest.raises(TypeError) as e:
        rope_compat.rotary_embedding(*args)
    assert str(e.value) == "query: expected a torch.Tensor, got ndarray"  # not the whole array


# ---- value rejections: the identical message on every path -------------------------------------


def _fake_call(op):
    def call(*args):
        with FakeTensorMode(allow_non_fake_inputs=False) as mode:
            op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args])
    return call


def _value_paths(op: str, device: str, needs_data: bool) -> Dict[str, Callable]:
    entries = {k: v for k, v in _entries(op).items() if k != "inplace alias"}
    if device != "cuda":
        entries.pop("launch")
    elif entries["launch"] is None:
        entries.pop("launch")
    if device == "cuda":
        entries.pop("torch_impl")  # the Torch implementation on CUDA skips bounds checks by design
    if not needs_data:
        entries["fake"] = _fake_call(getattr(torch.ops.rope_compat, op))
    return entries


def _messages(op, args, device, needs_data):
    out = {}
    for entry, call in _value_paths(op, device, needs_data).items():
        got = _outcome(call, args)
        assert got is not None, f"{entry} accepted a rejected input"
        out[entry] = got
    return out


def _names_device(row_id: str) -> bool:
    return "device" in row_id


@pytest.mark.parametrize("row", REJECTIONS, ids=lambda r: r.id)
def test_value_rejection_identical_on_every_path(row, device):
    if row.needs_data and device != "cpu":
        pytest.skip("bounds are checked where positions are read: CPU")
    case = row.mutate(_base(device), device)
    got = _messages("rotary_embedding", case.args(), device, row.needs_data)
    assert len(set(got.values())) == 1, got
    exc, message = next(iter(got.values()))
    assert exc is row.error and re.search(row.match, message)
    if device == "cuda" and not _names_device(row.id):
        cpu = row.mutate(_base("cpu"), "cpu")
        assert _outcome(rope_compat.rotary_embedding, cpu.args()) == (exc, message)


@pytest.mark.parametrize("row", BATCHED_REJECTIONS, ids=lambda r: r.id)
def test_batched_value_rejection_identical_on_every_path(row, device):
    if row.needs_data and device != "cpu":
        pytest.skip("bounds are checked where positions are read: CPU")
    args = tuple(row.mutate(_batched_base(device), device).values())
    got = _messages("batched_rotary_embedding", args, device, row.needs_data)
    assert len(set(got.values())) == 1, got
    assert next(iter(got.values()))[0] is row.error


def test_set_kv_value_rejections_identical_on_every_path(device):
    from test_fused_kv_store import BAD, _error_inputs

    for name, bad, exc, match in BAD:
        case, kv = _error_inputs(device)
        kv[name] = bad(kv)
        args = (case.positions, case.query, case.key, 32, case.cos_sin_cache, True, kv["value"], kv["k_buffer"],
                kv["v_buffer"], kv["cache_loc"], kv["k_scale"], kv["v_scale"], 0)
        got = _messages("rotary_embedding_set_kv", args, device, needs_data=False)
        assert len(set(got.values())) == 1, (name, got)
        assert next(iter(got.values()))[0] is exc and re.search(match, next(iter(got.values()))[1])


# ---- the other public entry points --------------------------------------------------------------


def test_out_of_place_function_types():
    args = _rotary_args("cpu")[:6]
    for index, value, name, expected in [
        (1, None, "query", "a torch.Tensor"), (1, np.zeros(3), "query", "a torch.Tensor"),
        (3, 128.0, "head_size", "an int (64-bit)"), (2, "k", "key", "a torch.Tensor or None"),
    ]:
        bad = list(args)
        bad[index] = value
        with pytest.raises(TypeError) as e:
            rope_compat.apply_rope_with_cos_sin_cache(*bad)
        assert str(e.value) == f"{name}: expected {expected}, got {type(value).__name__}"


@pytest.mark.parametrize(
    "build, exc, text",
    [
        (lambda: rope_compat.get_rope(128.0, 8192, True), TypeError, "head_size: expected an int (64-bit), got float"),
        (lambda: rope_compat.get_rope(128, "8192", True), TypeError, "max_position: expected an int (64-bit), got str"),
        (lambda: rope_compat.get_rope(128, 8192, None), TypeError, "is_neox_style: expected a bool, got NoneType"),
        (lambda: rope_compat.get_rope(128, 8192, True, "yarn"), TypeError,
         "rope_parameters: expected a dict or None, got str"),
        (lambda: rope_compat.get_rope(128, 8192, True, {"rope_type": "yarn", "factor": 4}), ValueError,
         "rope_parameters: rope_type 'yarn' needs original_max_position_embeddings"),
        (lambda: rope_compat.RotaryEmbedding(128.0, 128, 8192, 1e4, True), TypeError,
         "head_size: expected an int (64-bit), got float"),
        (lambda: rope_compat.RotaryEmbedding(128, 64.0, 8192, 1e4, True), TypeError,
         "rotary_dim: expected an int (64-bit), got float"),
        (lambda: rope_compat.RotaryEmbedding(128, 128, 8192, "1e4", True), TypeError,
         "base: expected a float or None, got str"),
        (lambda: rope_compat.RotaryEmbedding(128, 128, 8192, 1e4, True, "bf16"), TypeError,
         "dtype: expected a torch.dtype or None, got str"),
        (lambda: rope_compat.RotaryEmbedding(64, 128, 8192, 1e4, True), ValueError,
         "rotary_dim: 128 exceeds head_size=64"),
        (lambda: rope_compat.RotaryEmbedding(0, 0, 8192, 1e4, True), ValueError, "head_size: must be positive, got 0"),
    ],
)
def test_builders_reject_bad_arguments(build, exc, text):
    with pytest.raises(exc) as e:
        build()
    assert str(e.value) == text


def test_yarn_error_same_from_get_rope_and_module():
    params = {"rope_type": "yarn", "factor": 4}
    with pytest.raises(ValueError) as a:
        rope_compat.get_rope(128, 8192, True, params)
    with pytest.raises(ValueError) as b:
        rope_compat.RotaryEmbedding(128, 128, 8192, 1e4, True, None, params)
    assert str(a.value) == str(b.value)


@pytest.mark.parametrize("query", [None, np.zeros((6, 256), dtype=np.float32), 3])
def test_module_forward_rejects_non_tensors(query):
    rope = rope_compat.get_rope(64, 256, True)
    with pytest.raises(TypeError) as e:
        rope(torch.arange(6), query, None)
    assert str(e.value) == f"query: expected a torch.Tensor, got {type(query).__name__}"


@pytest.mark.parametrize(
    "args, text",
    [
        ((None, torch.tensor([0])), "indptr: expected a torch.Tensor, got NoneType"),
        ((torch.tensor([0, 1]), [4]), "offsets: expected a torch.Tensor, got list"),
        ((torch.tensor([0, 1]), torch.tensor([4]), 1.0), "num_tokens: expected an int (64-bit), got float"),
    ],
)
def test_positions_from_offsets_types(args, text):
    with pytest.raises(TypeError) as e:
        rope_compat.positions_from_offsets(*args)
    assert str(e.value) == text
