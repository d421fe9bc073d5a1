"""Gradients: right, or refused with a clear error; never silently wrong.

The out-of-place paths (apply_rope_with_cos_sin_cache, the modules with inputs that require
grad, the functional op) are differentiable: gradcheck in float64, float32/bf16 gradients
against autograd through the float64 reference, double backward, torch.compile. The in-place
ops refuse a tensor they write that requires grad while grad mode is on, before writing.
"""

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

import rope_compat
from rope_compat.ops.autograd import CACHE_GRAD_MESSAGE
from rope_compat.tolerances import TOLERANCES

from cases import LAYOUTS, make_case, random_cache
from reference import rope_reference

functional = torch.ops.rope_compat.rotary_embedding_functional

# (tokens, heads, kv_heads, head_size, rot_dim, rope_dim_offset): full, partial with an
# offset, 2-D positions, MQA, odd sizes.
GEOMETRIES = [
    ((5,), 4, 2, 64, 64, 0),
    ((3,), 2, 1, 48, 16, 8),
    ((2, 3), 3, 3, 32, 32, 0),
    ((7,), 3, 1, 40, 24, 16),
]


def _leaf_case(geometry, dtype, layout, is_neox, device, inverse=False):
    """A case, the autograd leaves, and `views(*leaves) -> (query, key)`: in the fused layouts
    q and k stay strided views of one qkv leaf, as engines slice them."""
    tokens, heads, kv_heads, head_size, rot_dim, offset = geometry
    case = make_case(
        tokens=tokens, heads=heads, kv_heads=kv_heads, head_size=head_size, rot_dim=rot_dim,
        rope_dim_offset=offset, is_neox=is_neox, dtype=dtype, layout=layout, inverse=inverse,
        cache_rows=64, device=device,
    )
    q_width, k_width = heads * head_size, kv_heads * head_size

    def per_head(q, k):
        if layout.endswith("heads"):
            return q.unflatten(-1, (heads, head_size)), k.unflatten(-1, (kv_heads, head_size))
        return q, k

    if layout.startswith("fused"):
        leaves = (case.query._base.detach().clone().requires_grad_(),)

        def views(qkv):
            return per_head(qkv[..., :q_width], qkv[..., q_width : q_width + k_width])
    else:
        leaves = (
            case.query.detach().reshape(*tokens, q_width).clone().requires_grad_(),
            case.key.detach().reshape(*tokens, k_width).clone().requires_grad_(),
        )

        def views(q, k):
            return per_head(q, k)

    return case, leaves, views


# Each geometry in one layout: the four layouts and four geometries, without the full product.
GEOMETRY_LAYOUTS = list(zip(GEOMETRIES, LAYOUTS))


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("geometry, layout", GEOMETRY_LAYOUTS, ids=str)
@pytest.mark.parametrize("inverse", [False, True])
def test_gradcheck_float64(geometry, is_neox, layout, inverse, device):
    case, leaves, views = _leaf_case(geometry, torch.float64, layout, is_neox, device, inverse=inverse)
    args = (case.head_size, case.cos_sin_cache.double(), is_neox, case.rope_dim_offset, inverse)

    def f(*leaves):
        return functional(case.positions, *views(*leaves), *args)

    assert gradcheck(f, leaves)
    if not inverse:
        assert gradgradcheck(f, leaves)


@pytest.mark.parametrize("with_key", [True, False])
@pytest.mark.parametrize("is_neox", [True, False])
def test_gradcheck_public_function_float64(is_neox, with_key, device):
    case = make_case(tokens=(6,), heads=4, kv_heads=2, head_size=32, is_neox=is_neox, cache_rows=40,
                     with_key=with_key, device=device)
    cache = case.cos_sin_cache.double()
    q = case.query.double().requires_grad_()
    inputs = (q,) + ((case.key.double().requires_grad_(),) if with_key else ())

    def f(q, k=None):
        out_q, out_k = rope_compat.apply_rope_with_cos_sin_cache(case.positions, q, k, 32, cache, is_neox)
        return out_q if k is None else (out_q, out_k)

    assert gradcheck(f, inputs)


def _reference_grads(case, query, key, grads, is_neox, inverse):
    """Gradients of sum(out * grad) with respect to query and key, by autograd through the
    float64 reference."""
    q64 = query.detach().double().cpu().requires_grad_()
    k64 = None if key is None else key.detach().double().cpu().requires_grad_()
    out_q, out_k = rope_reference(
        case.positions, q64, k64, case.head_size, case.cos_sin_cache, is_neox, case.rope_dim_offset, inverse
    )
    loss = (out_q * grads[0].double().cpu()).sum()
    if k64 is not None:
        loss = loss + (out_k * grads[1].double().cpu()).sum()
    return torch.autograd.grad(loss, [t for t in (q64, k64) if t is not None])


def _check_grads_against_reference(geometry, dtype, layout, is_neox, inverse, device):
    case, leaves, views = _leaf_case(geometry, dtype, layout, is_neox, device, inverse=inverse)
    query, key = views(*leaves)
    out_q, out_k = functional(
        case.positions, query, key, case.head_size, case.cos_sin_cache, is_neox, case.rope_dim_offset, inverse
    )
    grads = (torch.randn_like(out_q), torch.randn_like(out_k))
    got = torch.autograd.grad((out_q * grads[0]).sum() + (out_k * grads[1]).sum(), [query, key])
    want = _reference_grads(case, query, key, grads, is_neox, inverse)
    for name, g, w in zip(("query", "key"), got, want):
        assert g.dtype == dtype and g.shape == w.shape
        # One rounding of the float32 math to the dtype, as in the forward.
        torch.testing.assert_close(g.double().cpu(), w, **TOLERANCES[dtype], msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("geometry, layout", GEOMETRY_LAYOUTS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_grads_match_float64_reference_cpu(dtype, geometry, is_neox, layout, inverse):
    _check_grads_against_reference(geometry, dtype, layout, is_neox, inverse, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("inverse", [False, True])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_grads_match_float64_reference_cuda(dtype, geometry, is_neox, layout, inverse):
    """On CUDA the compiled kernel serves forward and backward (inverse=not inverse)."""
    _check_grads_against_reference(geometry, dtype, layout, is_neox, inverse, "cuda")


@pytest.mark.gpu
def test_cuda_backward_runs_the_kernel():
    """The backward of the functional op is the in-place op's CUDA kernel with inverse flipped."""
    from torch.profiler import ProfilerActivity, profile

    if not rope_compat.ops.extension.has_cuda_kernel():
        pytest.skip("no compiled CUDA kernel in this build")
    case = make_case(tokens=(64,), device="cuda")
    q = case.query.requires_grad_()
    out_q, _ = rope_compat.apply_rope_with_cos_sin_cache(case.positions, q, None, 64, case.cos_sin_cache)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out_q.backward(torch.randn_like(out_q))
        torch.cuda.synchronize()
    names = " ".join(e.name for e in prof.events())
    assert "rotary" in names.lower() or "rope" in names.lower(), names


def test_issue_example_no_longer_silently_wrong():
    """`q = x * 1; rotary_embedding(q)` then backward used to give x.grad == upstream grad."""
    case = make_case(tokens=(4,))
    x = case.query.clone().requires_grad_()
    q = x * 1
    with pytest.raises(RuntimeError, match=r"query: requires grad.*apply_rope_with_cos_sin_cache"):
        rope_compat.rotary_embedding(case.positions, q, case.key, 64, case.cos_sin_cache, True)
    assert torch.equal(q.detach(), case.query)
    out_q, _ = rope_compat.apply_rope_with_cos_sin_cache(case.positions, q, None, 64, case.cos_sin_cache, True)
    g = torch.randn_like(out_q)
    out_q.backward(g)
    (want,) = _reference_grads(case, x, None, (g, None), True, False)
    torch.testing.assert_close(x.grad.double(), want, **TOLERANCES[torch.float32])


def test_outputs_new_and_inputs_untouched(device):
    case = make_case(tokens=(5,), device=device)
    q = case.query.clone().requires_grad_()
    k = case.key.clone().requires_grad_()
    out_q, out_k = rope_compat.apply_rope_with_cos_sin_cache(case.positions, q, k, 64, case.cos_sin_cache)
    assert torch.equal(q.detach(), case.query) and torch.equal(k.detach(), case.key)
    assert out_q.data_ptr() != q.data_ptr() and out_k.data_ptr() != k.data_ptr()
    want_q, want_k = rope_reference(case.positions, case.query, case.key, 64, case.cos_sin_cache, True)
    torch.testing.assert_close(out_q.detach().double().cpu(), want_q, **TOLERANCES[torch.float32])
    torch.testing.assert_close(out_k.detach().double().cpu(), want_k, **TOLERANCES[torch.float32])


def test_only_key_output_used(device):
    case = make_case(tokens=(5,), device=device)
    q = case.query.clone().requires_grad_()
    k = case.key.clone().requires_grad_()
    _, out_k = rope_compat.apply_rope_with_cos_sin_cache(case.positions, q, k, 64, case.cos_sin_cache)
    g = torch.randn_like(out_k)
    out_k.backward(g)
    assert q.grad is None or not q.grad.any()  # no gradient, or autograd's materialized zeros
    want_k, _ = rope_reference(case.positions, g, None, 64, case.cos_sin_cache, True, inverse=True)
    torch.testing.assert_close(k.grad.double().cpu(), want_k, **TOLERANCES[torch.float32])


def test_cache_that_requires_grad_is_refused(device):
    case = make_case(tokens=(5,), device=device)
    q = case.query.clone().requires_grad_()
    cache = case.cos_sin_cache.clone().requires_grad_()
    with pytest.raises(RuntimeError, match="cos_sin_cache: requires grad"):
        rope_compat.apply_rope_with_cos_sin_cache(case.positions, q, None, 64, cache)
    with pytest.raises(RuntimeError, match="cos_sin_cache: requires grad"):
        rope_compat.apply_rope_with_cos_sin_cache(case.positions, case.query, None, 64, cache)
    assert CACHE_GRAD_MESSAGE.startswith("cos_sin_cache:")
    # With grad mode off nothing is recorded, so nothing is refused.
    with torch.no_grad():
        rope_compat.apply_rope_with_cos_sin_cache(case.positions, q, None, 64, cache)


@pytest.mark.parametrize("mrope", [False, True])
def test_modules_differentiable(mrope, device):
    """With inputs that require grad the modules return rotated copies (as vLLM's forward_native
    does) and backpropagate; without, they rotate in place as before."""
    if mrope:
        rope = rope_compat.get_rope(
            64, 256, True, {"rope_type": "default", "mrope_section": [8, 12, 12]}
        ).to(device)
        positions = torch.randint(0, 256, (3, 6), device=device)
    else:
        rope = rope_compat.get_rope(64, 256, True).to(device)
        positions = torch.randint(0, 256, (6,), device=device)
    query = torch.randn(6, 4 * 64, device=device)
    key = torch.randn(6, 2 * 64, device=device)
    want_q, want_k = rope(positions, query.clone(), key.clone())  # in place, no grad involved
    q, k = query.clone().requires_grad_(), key.clone().requires_grad_()
    out_q, out_k = rope(positions, q, k)
    assert torch.equal(q.detach(), query) and torch.equal(k.detach(), key), "inputs written"
    torch.testing.assert_close(out_q.detach(), want_q, **TOLERANCES[torch.float32])
    torch.testing.assert_close(out_k.detach(), want_k, **TOLERANCES[torch.float32])
    gq, gk = torch.randn_like(out_q), torch.randn_like(out_k)
    ((out_q * gq).sum() + (out_k * gk).sum()).backward()
    # Backward = the same rotation inverted: rotating the gradient back by the module itself
    # then forward again gives the upstream gradient.
    fq, fk = rope(positions, q.grad.clone(), k.grad.clone())
    torch.testing.assert_close(fq, gq, **TOLERANCES[torch.float32])
    torch.testing.assert_close(fk, gk, **TOLERANCES[torch.float32])


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_under_torch_compile(backend, device):
    if backend == "inductor" and device == "cpu":
        pytest.skip("inductor builds C++ on the CPU: too slow for the CPU suite; run on CUDA")
    case = make_case(tokens=(6,), heads=4, kv_heads=2, head_size=64, rot_dim=32, device=device)

    def f(positions, q, k, cache):
        out_q, out_k = rope_compat.apply_rope_with_cos_sin_cache(positions, q, k, 64, cache, False)
        return (out_q * 2).sum() + out_k.square().sum()

    torch._dynamo.reset()
    try:
        compiled = torch.compile(f, backend=backend, fullgraph=True)
        results = []
        for fn in (f, compiled):
            q = case.query.clone().requires_grad_()
            k = case.key.clone().requires_grad_()
            fn(case.positions, q, k, case.cos_sin_cache).backward()
            results.append((q.grad, k.grad))
    finally:
        torch._dynamo.reset()
    for eager_grad, compiled_grad in zip(*results):
        torch.testing.assert_close(compiled_grad, eager_grad, rtol=1e-5, atol=1e-5)


# --- the in-place ops: refused with grad, before anything is written ----------------------------


def _inplace_calls(case, device):
    """(name, call(query, key)) for every in-place entry point."""
    args = lambda q, k: (case.positions, q, k, 64, case.cos_sin_cache, True)  # noqa: E731
    half = case.cos_sin_cache.size(-1) // 2
    sections = [half - 2 * (half // 3), half // 3, half // 3]
    mrope = lambda q, k: (case.positions.repeat(3, 1), q, k, 64, case.cos_sin_cache, True, sections)  # noqa: E731
    offsets = torch.zeros(case.positions.shape, dtype=torch.int64, device=device)
    kv = lambda: (torch.randn_like(case.key), torch.zeros(64, 2 * 64, device=device),  # noqa: E731
                  torch.zeros(64, 2 * 64, device=device), torch.arange(case.positions.numel(), device=device))
    return [
        ("rotary_embedding", lambda q, k: rope_compat.rotary_embedding(*args(q, k))),
        ("rotary_embedding keywords", lambda q, k: rope_compat.rotary_embedding(
            positions=case.positions, query=q, key=k, head_size=64, cos_sin_cache=case.cos_sin_cache,
            is_neox=True)),
        ("op", lambda q, k: torch.ops.rope_compat.rotary_embedding(*args(q, k))),
        ("apply_rope_with_cos_sin_cache_inplace",
         lambda q, k: rope_compat.apply_rope_with_cos_sin_cache_inplace(*args(q, k))),
        ("batched_rotary_embedding",
         lambda q, k: rope_compat.batched_rotary_embedding(*args(q, k), 64, offsets)),
        ("rotary_embedding_set_kv", lambda q, k: rope_compat.rotary_embedding_set_kv(*args(q, k), *kv())),
        ("mrope_rotary_embedding", lambda q, k: rope_compat.mrope_rotary_embedding(*mrope(q, k))),
        ("mrope op", lambda q, k: torch.ops.rope_compat.mrope_rotary_embedding(*mrope(q, k))),
    ]


@pytest.mark.parametrize("which", ["query", "key"])
@pytest.mark.parametrize("entry", range(8))
def test_inplace_refuses_tensors_that_require_grad(entry, which, device):
    case = make_case(tokens=(5,), cache_rows=64, device=device)
    name, call = _inplace_calls(case, device)[entry]
    q, k = case.query.clone(), case.key.clone()
    target = q if which == "query" else k
    target.requires_grad_()
    before_q, before_k = q.detach().clone(), k.detach().clone()
    with pytest.raises(RuntimeError, match=rf"^{which}: requires grad, .*apply_rope_with_cos_sin_cache"):
        call(q, k)
    assert torch.equal(q.detach(), before_q) and torch.equal(k.detach(), before_k), f"{name} wrote"
    with torch.no_grad():  # the documented way around: not recorded, so allowed
        call(q, k)
    assert not torch.equal(q.detach(), before_q)


def test_set_kv_refuses_buffers_that_require_grad(device):
    case = make_case(tokens=(5,), cache_rows=64, device=device)
    value = torch.randn_like(case.key)
    k_buf = torch.zeros(64, 2 * 64, device=device).requires_grad_()
    v_buf = torch.zeros(64, 2 * 64, device=device)
    loc = torch.arange(5, device=device)
    before = case.query.clone()
    with pytest.raises(RuntimeError, match=r"^k_buffer: requires grad"):
        rope_compat.rotary_embedding_set_kv(
            case.positions, case.query, case.key, 64, case.cos_sin_cache, True, value, k_buf, v_buf, loc
        )
    assert torch.equal(case.query, before) and not k_buf.detach().any()


def test_inplace_refused_under_torch_compile(device):
    from torch._dynamo.exc import TorchRuntimeError

    case = make_case(tokens=(5,), device=device)
    q = case.query.clone().requires_grad_()

    def f(positions, q, cache):
        x = q * 1
        rope_compat.rotary_embedding(positions, x, None, 64, cache, True)
        return x.sum()

    torch._dynamo.reset()
    try:
        with pytest.raises((RuntimeError, TorchRuntimeError), match="apply_rope_with_cos_sin_cache"):
            torch.compile(f, backend="aot_eager", fullgraph=True)(case.positions, q, case.cos_sin_cache)
    finally:
        torch._dynamo.reset()
    assert q.grad is None


def test_no_grad_paths_unchanged(device):
    """No tensor requires grad: the out-of-place function keeps its clone + in-place path."""
    case = make_case(tokens=(5,), device=device)
    out_q, out_k = rope_compat.apply_rope_with_cos_sin_cache(case.positions, case.query, case.key, 64,
                                                            case.cos_sin_cache)
    assert out_q.grad_fn is None and out_k.grad_fn is None
    # float64 query and key: float64 math, by the Torch implementation on any device.
    out64, _ = rope_compat.apply_rope_with_cos_sin_cache(case.positions, case.query.double(), None, 64,
                                                         case.cos_sin_cache)
    want, _ = rope_reference(case.positions, case.query.double(), None, 64, case.cos_sin_cache, True)
    torch.testing.assert_close(out64.cpu(), want, rtol=1e-12, atol=1e-12)
    # The in-place op keeps refusing float64.
    with pytest.raises(TypeError, match="query: expected dtype float32, float16 or bfloat16"):
        rope_compat.rotary_embedding(case.positions, case.query.double(), None, 64, case.cos_sin_cache, True)


def test_random_cache_helper_is_float64_exact():
    # The float64 gradcheck above uses real cos/sin rows (random_cache): orthogonal rotations.
    c = random_cache(8, 16, torch.float64)
    torch.testing.assert_close(c[:, :8] ** 2 + c[:, 8:] ** 2, torch.ones(8, 8, dtype=torch.float64))
