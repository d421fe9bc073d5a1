"""The compiled entry points: `rope_compat.rotary_embedding` and
`rope_compat.rotary_embedding_set_kv` are C functions when the extension is built. They launch
plain positional CUDA calls themselves and hand every other call to the Python functions
`api._python_rotary_embedding` / `api._python_rotary_embedding_set_kv`; torch.compile traces
those functions instead. `rope_compat.compat.sgl.rope_and_store` (the fused call of SGLang and
sgl-kernel) is a C function too: it reads the arg's fields and calls the set_kv entry. So is
SGLang's `rope_compat.sglang.apply_rope_with_cos_sin_cache_inplace`: it sorts out the keywords
of SGLang's call and goes on to the other two, or hands the call to its Python function.

These tests need the compiled extension (a CUDA build of torch); their ids say `cuda` so the
GPU check selects them. Without the extension they skip.
"""

import inspect
import sys

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import rope_compat
from rope_compat import api
from rope_compat.compat import sgl

from cases import make_case
from reference import rope_reference
from tolerances import assert_matches_reference

pytestmark = pytest.mark.skipif(api._C is None, reason="needs the compiled extension (CUDA build)")

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def test_entry_is_the_compiled_function_cuda():
    assert rope_compat.rotary_embedding is api._C.rotary_embedding
    assert rope_compat.apply_rope_inplace_with_cache is api._C.rotary_embedding
    ours = inspect.signature(rope_compat.rotary_embedding)
    assert list(ours.parameters) == list(inspect.signature(api._python_rotary_embedding).parameters)
    assert ours.parameters["rope_dim_offset"].default == 0 and ours.parameters["inverse"].default is False


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("call", ["positional", "keywords", "defaults-given"])
def test_entry_matches_reference_every_way_it_is_called_cuda(device, call):
    case = make_case(tokens=(13,), heads=4, kv_heads=2, head_size=64, rot_dim=32, rope_dim_offset=16,
                     inverse=True, device=device)
    want_q, want_k = rope_reference(*case.args())
    p, q, k, d, cache, neox, off, inv = case.args()
    if call == "positional":
        rope_compat.rotary_embedding(p, q, k, d, cache, neox, off, inv)
    elif call == "keywords":
        rope_compat.rotary_embedding(p, q, k, d, cos_sin_cache=cache, is_neox=neox, rope_dim_offset=off,
                                     inverse=inv)
    else:
        rope_compat.rotary_embedding(positions=p, query=q, key=k, head_size=d, cos_sin_cache=cache,
                                     is_neox=neox, rope_dim_offset=off, inverse=inv)
    assert_matches_reference(q, want_q)
    assert_matches_reference(k, want_k)


@pytest.mark.gpu
def test_entry_hands_fake_tensors_to_the_op_cuda():
    case = make_case(tokens=(5,), heads=4, kv_heads=2, head_size=64, device="cuda")
    with FakeTensorMode() as mode:
        args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in case.args()]
        rope_compat.rotary_embedding(*args)  # the fake kernel: checks only, no launch
        with pytest.raises(ValueError, match="head_size"):
            rope_compat.rotary_embedding(args[0], args[1], args[2], 60, *args[4:])


@pytest.mark.parametrize("bad, match", [
    # Too few arguments go to the Python function, which says which ones are missing.
    ((1, 2, 3), r"missing 3 required positional arguments"),
    (("positions", [0, 1]), r"positions: expected a torch.Tensor, got list"),
    (("head_size", 64.0), r"head_size: expected an int \(64-bit\), got float"),
    (("key", "k"), r"key: expected a torch.Tensor or None, got str"),
])
@pytest.mark.gpu
def test_entry_rejects_wrong_types_by_name_cuda(bad, match):
    case = make_case(tokens=(5,), heads=4, kv_heads=2, head_size=64, device="cuda")
    names = ["positions", "query", "key", "head_size", "cos_sin_cache", "is_neox"]
    args = list(case.args())[:6]
    if isinstance(bad[0], int):
        args = args[:3]
    else:
        args[names.index(bad[0])] = bad[1]
    before = case.query.clone()
    with pytest.raises(TypeError, match=match):
        rope_compat.rotary_embedding(*args)
    assert torch.equal(case.query, before)


def test_entry_copy_is_distinct_and_traced_like_the_entry_cuda():
    copy = api.compiled_entry_copy("rotary_embedding")
    assert copy is api.compiled_entry_copy("rotary_embedding")  # one per process
    assert copy is not rope_compat.rotary_embedding
    case = make_case(tokens=(9,), heads=4, kv_heads=2, head_size=32, device="cpu")
    want_q, want_k = rope_reference(*case.args())
    q, k = case.query.clone(), case.key.clone()

    def block(positions, q, k, cache):
        copy(positions, q, k, case.head_size, cache, case.is_neox, case.rope_dim_offset, case.inverse)
        return q * 2, k * 2

    torch._dynamo.reset()
    explanation = torch._dynamo.explain(block)(case.positions, q, k, case.cos_sin_cache)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert_matches_reference(q, want_q)
    assert_matches_reference(k, want_k)


# The module's own functions, called directly: errors that the public entry point never
# produces (it sends host tensors and odd argument counts to the Python function).


def test_launch_rejects_host_tensors_before_touching_them_cuda():
    case = make_case(tokens=(5,), heads=4, kv_heads=2, head_size=64, device="cpu")
    before = case.query.clone()
    with pytest.raises(ValueError, match=r"positions: on device cpu; the compiled kernel takes CUDA tensors only"):
        api._C.launch(*case.args())
    assert torch.equal(case.query, before)


def test_launch_counts_its_arguments_cuda():
    case = make_case(tokens=(5,), heads=4, kv_heads=2, head_size=64, device="cpu")
    with pytest.raises(TypeError, match=r"rotary_embedding: expected 6 to 8 positional arguments, got 3"):
        api._C.launch(*case.args()[:3])


@pytest.mark.parametrize("index, value, match", [
    (3, 2**64, r"head_size: expected an int \(64-bit\), got int"),  # overflows int64
    (5, torch.ones(2), r"is_neox: expected a bool, got Tensor"),  # its truth value raises
    (6, "0", r"rope_dim_offset: expected an int \(64-bit\), got str"),
])
def test_launch_rejects_scalars_it_cannot_convert_cuda(index, value, match):
    """Arguments are converted before any tensor is looked at, so host tensors suffice here."""
    case = make_case(tokens=(5,), heads=4, kv_heads=2, head_size=64, device="cpu")
    args = list(case.args())
    args[index] = value
    before = case.query.clone()
    with pytest.raises(TypeError, match=match):
        api._C.launch(*args)
    assert torch.equal(case.query, before)


@pytest.mark.parametrize("args, exc, match", [
    (("rotary_embedding", 3), TypeError, r"set_fallback: expected an entry point's name and a callable"),
    ((print,), TypeError, r"set_fallback: expected an entry point's name and a callable"),
    ((print, print), TypeError, r"set_fallback: expected an entry point's name and a callable"),
    (("rope_and_store", print), ValueError, r"set_fallback: no entry point 'rope_and_store' takes a fallback"),
])
def test_set_fallback_rejects_anything_but_an_entry_name_and_a_callable_cuda(args, exc, match):
    with pytest.raises(exc, match=match):
        api._C.set_fallback(*args)


@pytest.mark.parametrize("args", [("launch", object()), ("nope", object()), (3, object()), ("rotary_embedding",)])
def test_new_entry_copies_entry_points_only_cuda(args):
    with pytest.raises(ValueError, match=r"new_entry: expected the name of an entry point and a tag"):
        api._C.new_entry(*args)


# ---- rotary_embedding_set_kv's entry point (the call SGLang's fused KV store makes).


def _set_kv_case(device, tokens=11, offset=16, rot_dim=32):
    case = make_case(tokens=(tokens,), heads=4, kv_heads=2, head_size=64, rot_dim=rot_dim, rope_dim_offset=offset,
                     dtype=torch.bfloat16, device=device)
    value = torch.randn(tokens, 2, 64, dtype=torch.bfloat16, device=device)
    k_buf = torch.randn(3 * tokens, 2, 64, device=device).to(torch.bfloat16)
    v_buf = torch.randn(3 * tokens, 2, 64, device=device).to(torch.bfloat16)
    loc = torch.randperm(3 * tokens, device=device)[:tokens]
    return case, value, k_buf, v_buf, loc


def test_set_kv_entry_is_the_compiled_function_cuda():
    assert rope_compat.rotary_embedding_set_kv is api._C.rotary_embedding_set_kv
    ours = inspect.signature(rope_compat.rotary_embedding_set_kv)
    python = inspect.signature(api._python_rotary_embedding_set_kv)
    assert list(ours.parameters) == list(python.parameters)
    assert {n: p.default for n, p in ours.parameters.items() if p.default is not p.empty} == {
        n: p.default for n, p in python.parameters.items() if p.default is not p.empty}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("call", ["positional", "keywords", "scales-by-keyword"])
def test_set_kv_entry_matches_reference_every_way_it_is_called_cuda(device, call):
    case, value, k_buf, v_buf, loc = _set_kv_case(device)
    want_q, want_k = rope_reference(*case.args())
    k_before, v_before = k_buf.clone(), v_buf.clone()
    p, q, k, d, cache, neox, off, _ = case.args()
    f = rope_compat.rotary_embedding_set_kv
    if call == "positional":
        f(p, q, k, d, cache, neox, value, k_buf, v_buf, loc, None, 2.0, off)
    elif call == "keywords":
        f(positions=p, query=q, key=k, head_size=d, cos_sin_cache=cache, is_neox=neox, value=value, k_buffer=k_buf,
          v_buffer=v_buf, cache_loc=loc, v_scale=2.0, rope_dim_offset=off)
    else:
        f(p, q, k, d, cache, neox, value, k_buf, v_buf, loc, v_scale=2.0, rope_dim_offset=off)
    assert_matches_reference(q, want_q)
    assert_matches_reference(k, want_k)
    stored = torch.zeros(k_buf.shape[0], dtype=torch.bool, device=device)
    stored[loc] = True
    assert torch.equal(k_buf[loc].reshape(k.shape), k) and torch.equal(k_buf[~stored], k_before[~stored])
    assert torch.equal(v_buf[loc], (value.float() / 2.0).to(v_buf.dtype))
    assert torch.equal(v_buf[~stored], v_before[~stored])


@pytest.mark.gpu
def test_set_kv_entry_hands_fake_tensors_to_the_op_cuda():
    case, value, k_buf, v_buf, loc = _set_kv_case("cuda")
    args = (*case.args()[:6], value, k_buf, v_buf, loc)
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        rope_compat.rotary_embedding_set_kv(*fake)  # the fake kernel: checks only, no launch
        with pytest.raises(ValueError, match=r"cache_loc: expected a contiguous tensor of 11"):
            rope_compat.rotary_embedding_set_kv(*fake[:9], fake[9][:5])


@pytest.mark.parametrize("index, value, match", [
    (0, [0, 1], r"positions: expected a torch.Tensor, got list"),
    (7, "k", r"k_buffer: expected a torch.Tensor, got str"),
    (9, None, r"cache_loc: expected a torch.Tensor, got NoneType"),
    (10, "0.5", r"k_scale: expected a float or None, got str"),
])
@pytest.mark.gpu
def test_set_kv_entry_rejects_wrong_types_by_name_cuda(index, value, match):
    case, v, k_buf, v_buf, loc = _set_kv_case("cuda")
    args = [*case.args()[:6], v, k_buf, v_buf, loc, None, None]
    args[index] = value
    before = [t.clone() for t in (case.query, case.key, k_buf, v_buf)]
    with pytest.raises(TypeError, match=match):
        rope_compat.rotary_embedding_set_kv(*args)
    for old, new in zip(before, (case.query, case.key, k_buf, v_buf)):
        assert torch.equal(old, new)


@pytest.mark.parametrize("device", DEVICES)
def test_set_kv_entry_is_traced_without_a_graph_break_cuda(device):
    case, value, k_buf, v_buf, loc = _set_kv_case(device)
    want_q, _ = rope_reference(*case.args())
    p, q, k, d, cache, neox, off, _ = case.args()

    def block(positions, q, k, value, k_buf, v_buf, loc):
        rope_compat.rotary_embedding_set_kv(positions, q, k, d, cache, neox, value, k_buf, v_buf, loc, None, None, off)
        return q * 2

    torch._dynamo.reset()
    explanation = torch._dynamo.explain(block)(p, q, k, value, k_buf, v_buf, loc)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert_matches_reference(q, want_q)
    assert torch.equal(k_buf[loc].reshape(k.shape), k)


# ---- rope_and_store's compiled form (SGLang's and sgl-kernel's fused call): the arg's fields
# read in C, then rotary_embedding_set_kv's entry point. Same results and errors as the Python
# function, on every device; no reference leaked.

STORES = ["python", "compiled"]


def _store_fn(which):
    return sgl._python_rope_and_store if which == "python" else api._C.rope_and_store


class _Arg4:  # SGLang's 4-field arg: no k_scale / v_scale attributes at all
    def __init__(self, value, k_buffer, v_buffer, cache_loc):
        self.value, self.k_buffer, self.v_buffer, self.cache_loc = value, k_buffer, v_buffer, cache_loc


def test_rope_and_store_is_the_compiled_function_cuda():
    assert sgl.rope_and_store is api._C.rope_and_store
    assert rope_compat.sglang.rope_and_store is api._C.rope_and_store
    names = list(inspect.signature(api._C.rope_and_store).parameters)
    assert names == list(inspect.signature(sgl._python_rope_and_store).parameters)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", STORES)
@pytest.mark.parametrize("form", ["4-field", "6-field", "int-scale", "tensor-scale"])
def test_rope_and_store_matches_reference_cuda(device, which, form):
    case, value, k_buf, v_buf, loc = _set_kv_case(device, offset=0)  # the arg has no offset field
    want_q, want_k = rope_reference(*case.args())
    if form == "4-field":
        arg, scale = _Arg4(value, k_buf, v_buf, loc), 1.0
    else:
        v_scale = {"6-field": 2.0, "int-scale": 2, "tensor-scale": torch.tensor(2.0)}[form]
        arg, scale = rope_compat.FusedSetKVBufferArg(value, k_buf, v_buf, None, v_scale, loc), 2.0
    q, k = case.query, case.key
    refs = [sys.getrefcount(t) for t in (arg, value, k_buf, v_buf, loc)]
    _store_fn(which)(arg, case.positions, q, k, case.head_size, case.cos_sin_cache, case.is_neox)
    assert [sys.getrefcount(t) for t in (arg, value, k_buf, v_buf, loc)] == refs, "a reference leaked"
    assert_matches_reference(q, want_q)
    assert_matches_reference(k, want_k)
    assert torch.equal(k_buf[loc].reshape(k.shape), k)
    assert torch.equal(v_buf[loc], (value.float() / scale).to(v_buf.dtype))


@pytest.mark.parametrize("which", STORES)
@pytest.mark.parametrize("bad, exc, match", [
    ("no-key", ValueError, r"key: required when fused_set_kv_buffer_arg is given"),
    ("no-cache_loc", AttributeError, r"cache_loc"),
    ("scale-str", ValueError, r"could not convert string to float"),
    ("scale-list", TypeError, r"float\(\) argument must be"),
    ("bad-scale", ValueError, r"k_scale: must be a positive finite float or None, got -1.0"),
])
def test_rope_and_store_errors_match_the_python_function_cuda(which, bad, exc, match):
    case, value, k_buf, v_buf, loc = _set_kv_case("cpu", offset=0)
    arg = rope_compat.FusedSetKVBufferArg(value, k_buf, v_buf, loc)
    key = case.key
    if bad == "no-key":
        key = None
    elif bad == "no-cache_loc":
        arg = _Arg4(value, k_buf, v_buf, loc)
        del arg.cache_loc
    else:
        arg.k_scale = {"scale-str": "x", "scale-list": [1.0], "bad-scale": -1.0}[bad]
    before = [t.clone() for t in (case.query, case.key, k_buf, v_buf)]
    with pytest.raises(exc, match=match):
        _store_fn(which)(arg, case.positions, case.query, key, case.head_size, case.cos_sin_cache, case.is_neox)
    for old, new in zip(before, (case.query, case.key, k_buf, v_buf)):
        assert torch.equal(old, new)


def test_rope_and_store_counts_its_arguments_cuda():
    with pytest.raises(TypeError, match=r"rope_and_store: expected 7 positional arguments, got 2"):
        api._C.rope_and_store(1, 2)


@pytest.mark.parametrize("device", DEVICES)
def test_rope_and_store_is_traced_without_a_graph_break_cuda(device):
    case, value, k_buf, v_buf, loc = _set_kv_case(device, offset=0, rot_dim=64)  # SGLang's head = rope_dim
    arg = _Arg4(value, k_buf, v_buf, loc)
    want_q, _ = rope_reference(*case.args())
    p, q, k, cache, neox = case.positions, case.query, case.key, case.cos_sin_cache, case.is_neox

    def block(positions, q, k):
        rope_compat.sglang.apply_rope_with_cos_sin_cache_inplace(q, k, cache, positions, is_neox=neox,
                                                                 fused_args=arg)
        return q * 2

    torch._dynamo.reset()
    explanation = torch._dynamo.explain(block)(p, q, k)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert_matches_reference(q, want_q)
    assert torch.equal(k_buf[loc].reshape(k.shape), k)


# ---- SGLang's apply_rope_with_cos_sin_cache_inplace, compiled: the keywords of SGLang's call
# sorted out in C, then the rotary_embedding or rope_and_store entry; every other call to the
# Python function. Same results and errors as that function.

SGLANG_FORMS = ["python", "compiled"]


def _sglang_fn(which):
    sglang = rope_compat.sglang
    return sglang._python_apply_rope_with_cos_sin_cache_inplace if which == "python" else api._C.apply_rope_with_cos_sin_cache_inplace


def test_sglang_entry_is_the_compiled_function_with_sglangs_signature_cuda():
    assert rope_compat.sglang.apply_rope_with_cos_sin_cache_inplace is api._C.apply_rope_with_cos_sin_cache_inplace
    ours = inspect.signature(api._C.apply_rope_with_cos_sin_cache_inplace)
    python = inspect.signature(rope_compat.sglang._python_apply_rope_with_cos_sin_cache_inplace)
    assert [(p.name, p.kind, p.default) for p in ours.parameters.values()] == [
        (p.name, p.kind, p.default) for p in python.parameters.values()]


def _sglang_case(device, fused):
    case, value, k_buf, v_buf, loc = _set_kv_case(device, offset=0, rot_dim=64)  # SGLang's head = rope_dim
    arg = _Arg4(value, k_buf, v_buf, loc) if fused else None
    return case, arg, value, k_buf, v_buf, loc


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", SGLANG_FORMS)
@pytest.mark.parametrize("fused", [False, True], ids=["rope", "fused"])
@pytest.mark.parametrize("call", ["sglang-keywords", "positional", "mixed", "rope_dim-0", "rope_dim-False",
                                  "rope_dim-given", "fused-None-given", "reordered"])
def test_sglang_entry_matches_reference_every_way_it_is_called_cuda(device, which, fused, call):
    case, arg, value, k_buf, v_buf, loc = _sglang_case(device, fused)
    want_q, want_k = rope_reference(*case.args())
    k_before, v_before = k_buf.clone(), v_buf.clone()
    f, p, q, k, cache, neox = _sglang_fn(which), case.positions, case.query, case.key, case.cos_sin_cache, case.is_neox
    extra = {"fused_args": arg} if fused else {}
    if call == "sglang-keywords":  # as SGLang's RotaryEmbedding.forward_cuda calls it
        f(positions=p, q=q, k=k, cos_sin_cache=cache, is_neox=neox, fused_args=arg)
    elif call == "positional":
        f(q, k, cache, p, is_neox=neox, **extra)
    elif call == "mixed":
        f(q, k, cos_sin_cache=cache, positions=p, is_neox=neox, **extra)
    elif call == "rope_dim-0":
        f(q, k, cache, p, is_neox=neox, rope_dim=0, **extra)
    elif call == "rope_dim-False":
        f(q, k, cache, p, is_neox=neox, rope_dim=False, **extra)
    elif call == "rope_dim-given":
        f(q, k, cache, p, is_neox=neox, rope_dim=cache.shape[-1], **extra)
    elif call == "fused-None-given":
        f(q, k, cache, p, is_neox=neox, fused_args=arg)
    else:
        f(fused_args=arg, is_neox=neox, positions=p, cos_sin_cache=cache, k=k, q=q)
    assert_matches_reference(q, want_q)
    assert_matches_reference(k, want_k)
    if fused:
        stored = torch.zeros(k_buf.shape[0], dtype=torch.bool, device=device)
        stored[loc] = True
        assert torch.equal(k_buf[loc].reshape(k.shape), k) and torch.equal(k_buf[~stored], k_before[~stored])
        assert torch.equal(v_buf[loc], value) and torch.equal(v_buf[~stored], v_before[~stored])
    else:
        assert torch.equal(k_buf, k_before) and torch.equal(v_buf, v_before)


def _bad_sglang_call(f, bad, q, k, cache, p, arg):
    if bad == "missing-is_neox":
        f(q, k, cache, p)
    elif bad == "missing-positions":
        f(q, k, cache, is_neox=True)
    elif bad == "unknown-keyword":
        f(q, k, cache, p, is_neox=True, rope_dims=0)
    elif bad == "twice":
        f(q, k, cache, p, is_neox=True, q=q)
    elif bad == "too-many-positional":
        f(q, k, cache, p, True)
    elif bad == "rope_dim-differs":
        f(q, k, cache, p, is_neox=True, rope_dim=16)
    elif bad == "cache-not-a-tensor":
        f(q, k, [1.0], p, is_neox=True)
    elif bad == "cache-0-dim":
        f(q, k, torch.tensor(1.0), p, is_neox=True)
    elif bad == "is_neox-str":
        f(q, k, cache, p, is_neox="yes")
    elif bad == "fused-no-key":
        f(q, None, cache, p, is_neox=True, fused_args=arg)
    elif bad == "head-differs":
        f(q[..., :32], k[..., :32], cache, p, is_neox=True)


@pytest.mark.parametrize("bad", ["missing-is_neox", "missing-positions", "unknown-keyword", "twice",
                                 "too-many-positional", "rope_dim-differs", "cache-not-a-tensor", "cache-0-dim",
                                 "is_neox-str", "fused-no-key", "head-differs"])
@pytest.mark.parametrize("device", DEVICES)
def test_sglang_entry_errors_match_the_python_function_cuda(device, bad):
    """The same exception type and message from both forms, and nothing written."""
    raised = []
    for which in SGLANG_FORMS:
        case, arg, value, k_buf, v_buf, loc = _sglang_case(device, fused=True)
        before = [t.clone() for t in (case.query, case.key, k_buf, v_buf)]
        with pytest.raises(Exception) as info:
            _bad_sglang_call(_sglang_fn(which), bad, case.query, case.key, case.cos_sin_cache, case.positions, arg)
        raised.append((type(info.value), str(info.value).replace("_python_", "")))
        for old, new in zip(before, (case.query, case.key, k_buf, v_buf)):
            assert torch.equal(old, new)
    assert raised[0] == raised[1]


def test_sglang_entry_leaks_no_reference_cuda():
    case, arg, value, k_buf, v_buf, loc = _sglang_case("cpu", fused=True)
    objs = (arg, case.query, case.key, case.cos_sin_cache, case.positions)
    refs = [sys.getrefcount(o) for o in objs]
    for _ in range(3):
        api._C.apply_rope_with_cos_sin_cache_inplace(positions=case.positions, q=case.query, k=case.key,
                                                     cos_sin_cache=case.cos_sin_cache, is_neox=True, fused_args=arg)
        api._C.apply_rope_with_cos_sin_cache_inplace(case.query, case.key, case.cos_sin_cache, case.positions,
                                                     is_neox=True)
    assert [sys.getrefcount(o) for o in objs] == refs


@pytest.mark.parametrize("device", DEVICES)
def test_sglang_entry_copy_is_distinct_and_traced_without_a_graph_break_cuda(device):
    copy = api.compiled_entry_copy("apply_rope_with_cos_sin_cache_inplace")
    assert copy is not rope_compat.sglang.apply_rope_with_cos_sin_cache_inplace
    assert copy.__name__ == "apply_rope_with_cos_sin_cache_inplace"
    case, arg, value, k_buf, v_buf, loc = _sglang_case(device, fused=False)
    want_q, _ = rope_reference(*case.args())
    cache, neox = case.cos_sin_cache, case.is_neox

    def block(positions, q, k):
        copy(positions=positions, q=q, k=k, cos_sin_cache=cache, is_neox=neox, fused_args=None)
        return q * 2

    torch._dynamo.reset()
    explanation = torch._dynamo.explain(block)(case.positions, case.query, case.key)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert_matches_reference(case.query, want_q)
