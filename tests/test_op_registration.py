"""The registered ops: schema, torch.library.opcheck, the fake impl, torch.compile."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import rope_compat
from cases import make_case, random_cache
from reference import rope_reference
from tolerances import assert_matches_reference

ROTARY = torch.ops.rope_compat.rotary_embedding.default
BATCHED = torch.ops.rope_compat.batched_rotary_embedding.default

# vLLM's schema (csrc/torch_bindings.cpp), which code written against _C::rotary_embedding expects.
VLLM_ROTARY_SCHEMA = (
    "rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!)? key, int head_size, "
    "Tensor cos_sin_cache, bool is_neox, int rope_dim_offset=0, bool inverse=False) -> ()"
)
VLLM_BATCHED_SCHEMA = (
    "batched_rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!)? key, int head_size, "
    "Tensor cos_sin_cache, bool is_neox, int rot_dim, Tensor cos_sin_cache_offsets) -> ()"
)


def _args_signature(schema: torch._C.FunctionSchema) -> list:
    """(name, type, default, written) per argument: what callers and compiler passes see."""
    return [
        (a.name, str(a.type), a.default_value, a.alias_info is not None and a.alias_info.is_write)
        for a in schema.arguments
    ]


@pytest.mark.parametrize("op,expected", [(ROTARY, VLLM_ROTARY_SCHEMA), (BATCHED, VLLM_BATCHED_SCHEMA)])
def test_schema_is_vllms(op, expected):
    assert str(op._schema) == f"rope_compat::{expected}"
    parsed = torch._C.parse_schema(f"_C::{expected}")
    assert _args_signature(op._schema) == _args_signature(parsed)
    assert [a.name for a in op._schema.arguments if a.is_write] == ["query", "key"]
    assert len(op._schema.returns) == 0


OPCHECK_CASES = {
    "flat_neox_f32": dict(),
    "heads_gptj_bf16_cache_f32": dict(layout="heads", is_neox=False, dtype=torch.bfloat16),
    "fused_partial_offset_f16": dict(layout="fused_flat", rot_dim=16, rope_dim_offset=32, dtype=torch.float16),
    "batch_seq_positions_int32": dict(tokens=(2, 3), pos_dtype=torch.int32, layout="fused_heads"),
    "no_key_inverse": dict(with_key=False, inverse=True),
}


@pytest.mark.parametrize("name", OPCHECK_CASES)
def test_opcheck_rotary(device, name):
    case = make_case(**{"tokens": (5,), "cache_rows": 16, "device": device, **OPCHECK_CASES[name]})
    torch.library.opcheck(ROTARY, case.args())


def test_opcheck_batched(device):
    case = make_case(tokens=(6,), rot_dim=32, cache_rows=8, device=device)
    cache = random_cache(24, 32, torch.float32, device)
    offsets = torch.tensor([0, 8, 16, 0, 8, 16], device=device)
    torch.library.opcheck(
        BATCHED, (case.positions, case.query, case.key, case.head_size, cache, True, 32, offsets)
    )


def test_fake_impl_accepts_good_arguments():
    case = make_case(tokens=(2, 3), layout="fused_heads", rot_dim=32, rope_dim_offset=16)
    with FakeTensorMode() as mode:
        args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in case.args()]
        ROTARY(*args)  # no data, no error


@pytest.mark.parametrize(
    "change,exc",
    [
        (dict(head_size=48), ValueError),  # hidden size 256 not divisible by 48
        (dict(rope_dim_offset=8), ValueError),  # 8 + 64 > 64
        (dict(key_dtype=torch.float16), TypeError),
        (dict(positions_dtype=torch.float32), TypeError),
    ],
)
def test_fake_impl_checks_arguments(change, exc):
    case = make_case(tokens=(4,))
    positions = case.positions.to(change.get("positions_dtype", case.positions.dtype))
    key = case.key.to(change.get("key_dtype", case.key.dtype))
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in (positions, case.query, key, case.cos_sin_cache)]
        with pytest.raises(exc):
            ROTARY(
                fake[0], fake[1], fake[2], change.get("head_size", case.head_size), fake[3],
                True, change.get("rope_dim_offset", 0),
            )


def test_meta_tensors_are_checked():
    case = make_case(tokens=(4,), device="meta")
    ROTARY(*case.args())
    with pytest.raises(ValueError, match="head_size"):
        ROTARY(case.positions, case.query, case.key, 48, case.cos_sin_cache, True)


def _layer(positions, qkv, cos_sin_cache, q_width, k_width, head_size, is_neox):
    """What an attention layer does around the op: split a fused projection, rotate, use q and k."""
    qkv = qkv * 1.5
    q, k = qkv[:, :q_width], qkv[:, q_width : q_width + k_width]
    rope_compat.rotary_embedding(positions, q, k, head_size, cos_sin_cache, is_neox)
    return q.sum(-1) + k.sum(-1), qkv


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
def test_torch_compile_fullgraph_matches_eager(device, backend, is_neox):
    torch._dynamo.reset()
    positions = torch.randint(0, 64, (7,), device=device)
    qkv = torch.randn(7, 4 * 64 + 2 * 2 * 64, device=device)
    cache = random_cache(64, 64, torch.float32, device)
    args = (positions, qkv, cache, 256, 128, 64, is_neox)
    compiled = torch.compile(_layer, fullgraph=True, backend=backend)  # graph breaks raise
    out_eager, qkv_eager = _layer(*args)
    out_compiled, qkv_compiled = compiled(*args)
    torch.testing.assert_close(out_compiled, out_eager)
    torch.testing.assert_close(qkv_compiled, qkv_eager)
    expected_q, expected_k = rope_reference(
        positions, qkv[:, :256] * 1.5, qkv[:, 256:384] * 1.5, 64, cache, is_neox
    )
    assert_matches_reference(qkv_compiled[:, :256], expected_q)
    assert_matches_reference(qkv_compiled[:, 256:384], expected_k)


def test_torch_compile_sees_one_op():
    """Dynamo records the registered op, not the Torch implementation's internals."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("eager")
    case = make_case(tokens=(3,))
    torch.compile(lambda *a: rope_compat.rotary_embedding(*a), fullgraph=True, backend=counter)(*case.args())
    nodes = [n for g in counter.graphs for n in g.graph.nodes if n.op in ("call_function", "call_method")]
    targets = [n.target for n in nodes]
    assert ROTARY in targets
    assert "index_select" not in [getattr(t, "__name__", t) for t in targets]


def test_dispatch_modes_see_the_op():
    """Eager CPU calls may skip the dispatcher, but not when a dispatch mode is watching."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(func)
            return func(*args, **(kwargs or {}))

    case = make_case(tokens=(3,))
    expected_q, _ = rope_reference(*case.args())
    with Record() as record:
        rope_compat.rotary_embedding(*case.args())
    assert record.ops == [ROTARY]
    assert_matches_reference(case.query, expected_q)


@pytest.mark.parametrize("leaf", [True, False])
def test_tensors_that_require_grad_are_refused_in_place(device, leaf):
    """The in-place op is not differentiable: with grad mode on it refuses a query that requires
    grad (naming the differentiable function) before writing; under no_grad it rotates."""
    case = make_case(tokens=(4,), device=device)
    q = case.query.requires_grad_() if leaf else case.query.requires_grad_() * 2
    before_q, before_k = q.detach().clone(), case.key.clone()
    for call in (rope_compat.rotary_embedding, torch.ops.rope_compat.rotary_embedding):
        with pytest.raises(RuntimeError, match=r"query: requires grad.*apply_rope_with_cos_sin_cache"):
            call(case.positions, q, case.key, 64, case.cos_sin_cache, True)
        assert torch.equal(q.detach(), before_q) and torch.equal(case.key, before_k)
    expected_q, expected_k = rope_reference(case.positions, q.detach(), case.key, 64, case.cos_sin_cache, True)
    with torch.no_grad():
        rope_compat.rotary_embedding(case.positions, q, case.key, 64, case.cos_sin_cache, True)
    assert_matches_reference(q.detach(), expected_q)
    assert_matches_reference(case.key, expected_k)
