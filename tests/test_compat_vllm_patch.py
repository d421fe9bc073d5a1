"""patch_vllm / unpatch_vllm against a real vLLM (its CPU kernel), and the schema check.

vLLM's CPU kernel supports flat layouts only, no rope_dim_offset or inverse, and a cache of
the query's dtype, so comparisons with it stay inside that. Proof that rope-compat runs
after a patch uses `inverse=True`: vLLM's CPU kernel refuses it, rope-compat's computes it.
"""

import sys
import threading
import types

import pytest
import torch

import rope_compat
from rope_compat.compat import plugin, startup
from rope_compat.compat.vllm_patch import UnsupportedVllmError, check_vllm_schema

from cases import make_case
from reference import rope_reference
from tolerances import TOLERANCES, assert_matches_reference
from vllm_env import vllm_importable


@pytest.fixture(scope="module")
def vllm_ops():
    """vLLM's `_custom_ops` module; tests that use it are marked `vllm` and skip without it."""
    if not vllm_importable():
        pytest.skip("needs vLLM")
    import vllm._custom_ops as ops
    if not torch._C._dispatch_has_kernel_for_dispatch_key("_C::rotary_embedding", "CPU"):
        pytest.skip("this vLLM build has no CPU kernel")
    return ops


@pytest.fixture(autouse=True)
def unpatched():
    rope_compat.unpatch_vllm()
    yield
    rope_compat.unpatch_vllm()


def _inverse_case(**kw):
    return make_case(tokens=(9,), heads=4, kv_heads=2, head_size=64, inverse=True, **kw)


def _assert_runs_rope_compat(call) -> None:
    """`call(*args)` computes the inverse rotation (which vLLM's CPU kernel refuses)."""
    case = _inverse_case()
    want_q, want_k = rope_reference(*case.args())
    call(*case.args())
    assert_matches_reference(case.query, want_q)
    assert_matches_reference(case.key, want_k)


def _assert_runs_vllm_kernel(call) -> None:
    with pytest.raises(RuntimeError, match="not supported on CPU"):
        call(*_inverse_case().args())


@pytest.mark.vllm
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("layout", ["flat", "fused_flat"])
@pytest.mark.parametrize(
    "tokens, head_size, rot_dim, with_key",
    [((13,), 64, 64, True), ((2, 5), 128, 32, True), ((7,), 80, 80, False)],
)
def test_patched_function_matches_vllm_kernel(vllm_ops, dtype, is_neox, layout, tokens, head_size, rot_dim, with_key):
    original = vllm_ops.rotary_embedding
    case = make_case(
        tokens=tokens, heads=4, kv_heads=2, head_size=head_size, rot_dim=rot_dim, is_neox=is_neox,
        dtype=dtype, cache_dtype=dtype, layout=layout, with_key=with_key,
    )
    q, k = case.query.clone(), None if case.key is None else case.key.clone()  # for vLLM's kernel

    rope_compat.patch_vllm()
    assert vllm_ops.rotary_embedding is not original
    vllm_ops.rotary_embedding(case.positions, case.query, case.key, head_size, case.cos_sin_cache, is_neox)
    original(case.positions, q, k, head_size, case.cos_sin_cache, is_neox)

    torch.testing.assert_close(case.query, q, **TOLERANCES[dtype])
    if with_key:
        torch.testing.assert_close(case.key, k, **TOLERANCES[dtype])


@pytest.mark.vllm
def test_patch_is_idempotent_and_unpatch_restores_identical_objects(vllm_ops):
    original = vllm_ops.rotary_embedding
    first = rope_compat.patch_vllm()
    replacement = vllm_ops.rotary_embedding
    second = rope_compat.patch_vllm()
    assert vllm_ops.rotary_embedding is replacement
    assert first == second and first.patched
    assert "vllm._custom_ops.rotary_embedding" in first.functions["rotary_embedding"]
    _assert_runs_rope_compat(vllm_ops.rotary_embedding)

    rope_compat.unpatch_vllm()
    assert vllm_ops.rotary_embedding is original
    rope_compat.unpatch_vllm()
    assert vllm_ops.rotary_embedding is original
    assert not rope_compat.patch_status().patched
    _assert_runs_vllm_kernel(vllm_ops.rotary_embedding)


def _module_importing_rotary(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec("from vllm._custom_ops import rotary_embedding", module.__dict__)
    sys.modules[name] = module
    return module


@pytest.mark.vllm
def test_names_imported_before_and_after_the_patch_are_rebound_and_restored(vllm_ops):
    original = vllm_ops.rotary_embedding
    before = _module_importing_rotary("rope_compat_test_engine_before")
    try:
        status = rope_compat.patch_vllm()
        assert before.rotary_embedding is vllm_ops.rotary_embedding is not original
        assert "rope_compat_test_engine_before.rotary_embedding" in status.functions["rotary_embedding"]
        _assert_runs_rope_compat(before.rotary_embedding)

        after = _module_importing_rotary("rope_compat_test_engine_after")
        assert after.rotary_embedding is vllm_ops.rotary_embedding

        rope_compat.unpatch_vllm()
        assert before.rotary_embedding is original
        assert after.rotary_embedding is original
        assert rope_compat.rotary_embedding is not original  # rope-compat's own name untouched
    finally:
        sys.modules.pop("rope_compat_test_engine_before", None)
        sys.modules.pop("rope_compat_test_engine_after", None)


@pytest.mark.vllm
def test_a_module_under_two_names_is_listed_once(vllm_ops):
    # multiprocessing registers `__main__` a second time as `__mp_main__`.
    module = _module_importing_rotary("rope_compat_test_engine_main")
    sys.modules["rope_compat_test_engine_mp_main"] = module
    try:
        bound = rope_compat.patch_vllm().functions["rotary_embedding"]
        names = [n for n in bound if n.startswith("rope_compat_test_engine_")]
        assert names == ["rope_compat_test_engine_main.rotary_embedding"], bound
        assert module.rotary_embedding is vllm_ops.rotary_embedding
    finally:
        rope_compat.unpatch_vllm()
        sys.modules.pop("rope_compat_test_engine_main", None)
        sys.modules.pop("rope_compat_test_engine_mp_main", None)


@pytest.mark.vllm
def test_context_manager_keeps_a_patch_applied_before_it(vllm_ops):
    original = vllm_ops.rotary_embedding
    with rope_compat.vllm_patched() as status:
        assert status.functions and vllm_ops.rotary_embedding is not original
    assert vllm_ops.rotary_embedding is original

    rope_compat.patch_vllm()
    patched = vllm_ops.rotary_embedding
    with rope_compat.vllm_patched():
        pass
    assert vllm_ops.rotary_embedding is patched


@pytest.mark.vllm
def test_concurrent_patches_apply_once(vllm_ops):
    original = vllm_ops.rotary_embedding
    seen = []
    threads = [
        threading.Thread(target=lambda: (rope_compat.patch_vllm(), seen.append(vllm_ops.rotary_embedding)))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 8 and all(f is seen[0] for f in seen) and seen[0] is not original
    rope_compat.unpatch_vllm()
    assert vllm_ops.rotary_embedding is original


@pytest.mark.vllm
def test_dispatcher_route_serves_vllm_op_and_is_reversible(vllm_ops):
    op = torch.ops._C.rotary_embedding
    original = vllm_ops.rotary_embedding
    _assert_runs_vllm_kernel(op)

    status = rope_compat.patch_vllm(dispatcher=True)
    assert status.dispatch_keys == ("CPU",)
    assert status.vllm_schema == str(op.default._schema)
    assert vllm_ops.rotary_embedding is original  # Python layer untouched
    _assert_runs_rope_compat(op)
    _assert_runs_rope_compat(vllm_ops.rotary_embedding)  # vLLM's function, through the op
    assert rope_compat.patch_vllm(dispatcher=True) == status

    # The 6-argument form vLLM uses (the dispatcher passes only what was given).
    case = make_case(tokens=(5,), head_size=64)
    want_q, want_k = rope_reference(*case.args())
    op(case.positions, case.query, case.key, 64, case.cos_sin_cache, True)
    assert_matches_reference(case.query, want_q)
    assert_matches_reference(case.key, want_k)

    rope_compat.unpatch_vllm()
    assert rope_compat.patch_status().dispatch_keys == ()
    _assert_runs_vllm_kernel(op)
    rope_compat.patch_vllm(dispatcher=True)  # registering again after the release works
    _assert_runs_rope_compat(op)


@pytest.mark.vllm
def test_both_routes_together(vllm_ops):
    original = vllm_ops.rotary_embedding
    rope_compat.patch_vllm()
    status = rope_compat.patch_vllm(dispatcher=True)
    assert status.functions and status.dispatch_keys == ("CPU",)
    rope_compat.unpatch_vllm()
    assert vllm_ops.rotary_embedding is original
    _assert_runs_vllm_kernel(torch.ops._C.rotary_embedding)


@pytest.mark.vllm
@pytest.mark.parametrize(
    "env, expect",
    [(None, "dispatcher"), ("1", "functions"), ("dispatcher", "dispatcher"), ("0", None)],
    ids=["unset", "1", "dispatcher", "0"],
)
def test_plugin_register_routes(vllm_ops, monkeypatch, env, expect):
    if env is None:
        monkeypatch.delenv(startup.ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(startup.ENV_VAR, env)
    plugin.register()
    status = rope_compat.patch_status()
    assert bool(status.dispatch_keys) == (expect == "dispatcher")
    assert bool(status.functions) == (expect == "functions")


@pytest.mark.vllm
def test_alias_refuses_to_shadow_real_vllm(vllm_ops):
    with pytest.warns(RuntimeWarning, match="real vLLM is installed"):
        assert rope_compat.install_vllm_alias() is False
    assert sys.modules["vllm._custom_ops"] is vllm_ops
    assert rope_compat.uninstall_vllm_alias() is False


def _scratch_schema(lib: torch.library.Library, name: str, args: str):
    lib.define(f"{name}({args}) -> ()")
    return getattr(torch.ops.rope_compat_schema_test, name).default._schema


@pytest.fixture(scope="module")
def scratch_lib():
    lib = torch.library.Library("rope_compat_schema_test", "DEF")
    yield lib
    lib._destroy()


VLLM_ARGS = (
    "Tensor positions, Tensor(a!) query, Tensor(b!)? key, int head_size, Tensor cos_sin_cache, "
    "bool is_neox"
)


@pytest.mark.parametrize(
    "name, args, known",
    [
        ("current", VLLM_ARGS + ", int rope_dim_offset=0, bool inverse=False", True),
        ("older", VLLM_ARGS, True),
        ("renamed_arg", VLLM_ARGS.replace("cos_sin_cache", "cache"), False),
        ("key_not_optional", VLLM_ARGS.replace("Tensor(b!)? key", "Tensor(b!) key"), False),
        ("key_not_mutated", VLLM_ARGS.replace("Tensor(b!)? key", "Tensor? key"), False),
        ("other_default", VLLM_ARGS + ", int rope_dim_offset=1, bool inverse=False", False),
        ("extra_arg", VLLM_ARGS + ", int rope_dim_offset=0, bool inverse=False, int x=0", False),
    ],
)
def test_schema_check(scratch_lib, name, args, known):
    schema = _scratch_schema(scratch_lib, name, args)
    if known:
        check_vllm_schema(schema)
    else:
        with pytest.raises(UnsupportedVllmError, match="does not know"):
            check_vllm_schema(schema)

