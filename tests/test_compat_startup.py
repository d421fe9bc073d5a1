"""Start-up switches, each in a fresh interpreter: the ROPE_COMPAT_PATCH hook (.pth), vLLM's
plugin entry point, and the vllm alias where vLLM cannot be imported.

Children start with `python -S` and run `site.main()` themselves, so that a test can hide
vLLM before site-packages (and the .pth files in it) are processed. Where rope-compat is
installed (CI runs `pip install -e .`), the installed hook and entry point are the ones
exercised; otherwise the repository's .pth file is processed with `site.addsitedir` and the
entry point is declared by a temporary dist-info directory.
"""

import importlib.metadata
import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rope_compat.compat.startup import ENV_VAR
from vllm_env import vllm_importable

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
HOOK = "rope_compat_startup.pth"
HAS_VLLM = vllm_importable()


def _installed_dist():
    try:
        return importlib.metadata.distribution("rope-compat")
    except importlib.metadata.PackageNotFoundError:
        return None


DIST = _installed_dist()

HIDE_VLLM = """
import sys
from importlib.machinery import PathFinder

class _NoVllm(PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return None if name.split(".")[0] == "vllm" else PathFinder.find_spec(name, path, target)

sys.meta_path[sys.meta_path.index(PathFinder)] = _NoVllm
"""

# The child's check that rope-compat runs: an inverse rotation, which vLLM's CPU kernel
# refuses. Imports stay inside, so that a child that never calls it imports nothing.
ROTATE_INVERSE = f"""
def rotates_inverse(fn):
    import sys
    sys.path.insert(0, {str(TESTS)!r})
    from cases import make_case
    from reference import rope_reference
    from tolerances import assert_matches_reference

    case = make_case(tokens=(6,), inverse=True)
    want_q, want_k = rope_reference(*case.args())
    fn(*case.args())
    assert_matches_reference(case.query, want_q)
    assert_matches_reference(case.key, want_k)
    return True
"""


@pytest.fixture(scope="module")
def hook_dir(tmp_path_factory):
    """None where the hook is installed; else a directory holding the repository's copy."""
    if DIST is not None and DIST.files and any(f.name == HOOK for f in DIST.files):
        return None
    path = tmp_path_factory.mktemp("site")
    shutil.copy(REPO / HOOK, path / HOOK)
    return path


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory):
    """None where the installed distribution declares the entry point; else a sys.path
    entry whose dist-info declares the same one."""
    if DIST is not None and any(ep.group == "vllm.general_plugins" for ep in DIST.entry_points):
        return None
    path = tmp_path_factory.mktemp("entry_point")
    info = path / "rope_compat_plugin_test-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rope-compat-plugin-test\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        "[vllm.general_plugins]\nrope_compat = rope_compat.compat.plugin:register\n"
    )
    return path


def run_child(code: str, env: dict, hook_dir, hide_vllm=False, extra_path=None) -> dict:
    """Run `code` in a fresh interpreter, after ROTATE_INVERSE's definitions; it must print
    one JSON object on its last line."""
    prelude = HIDE_VLLM if hide_vllm else ""
    site = "import site; site.main()\n"
    if hook_dir is not None:
        site += f"site.addsitedir({str(hook_dir)!r})\n"
    child_env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, "VLLM_PLUGINS")}
    paths = [str(REPO)] + ([str(extra_path)] if extra_path else [])
    child_env["PYTHONPATH"] = os.pathsep.join(paths + [child_env.get("PYTHONPATH", "")])
    child_env.update(env)
    script = "import sys\n" + prelude + site + ROTATE_INVERSE + textwrap.dedent(code)
    proc = subprocess.run(
        [sys.executable, "-S", "-c", script], env=child_env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("value", [None, "0"], ids=["unset", "0"])
def test_without_the_variable_nothing_is_imported(hook_dir, value):
    env = {} if value is None else {ENV_VAR: value}
    out = run_child(
        """
        import json, sys
        print(json.dumps({"loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("rope_compat", "torch"))}))
        """,
        env, hook_dir,
    )
    assert out["loaded"] == []


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="needs vLLM")
def test_variable_patches_vllm_when_it_is_imported(hook_dir):
    out = run_child(
        """
        import json
        import rope_compat
        pending = rope_compat.patch_status().pending
        vllm_imported_at_start = "vllm" in sys.modules
        from vllm import _custom_ops as ops
        status = rope_compat.patch_status()
        print(json.dumps({
            "pending": pending,
            "vllm_imported_at_start": vllm_imported_at_start,
            "functions": status.functions,
            "dispatch_keys": list(status.dispatch_keys),
            "still_pending": status.pending,
            "rotates": rotates_inverse(ops.rotary_embedding),
        }))
        """,
        {ENV_VAR: "1"}, hook_dir,
    )
    assert out["pending"] == ["functions"]
    assert not out["vllm_imported_at_start"] and out["still_pending"] == []
    assert "vllm._custom_ops.rotary_embedding" in out["functions"]["rotary_embedding"]
    assert out["dispatch_keys"] == [] and out["rotates"]


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="needs vLLM")
def test_vllm_plugin_entry_point_patches_the_process(hook_dir, plugin_path):
    out = run_child(
        """
        import json
        import vllm.plugins
        loaded_before = "rope_compat" in sys.modules
        vllm.plugins.load_general_plugins()
        import rope_compat, torch
        status = rope_compat.patch_status()
        print(json.dumps({
            "loaded_before": loaded_before,
            "dispatch_keys": list(status.dispatch_keys),
            "rotates": rotates_inverse(torch.ops._C.rotary_embedding),
        }))
        """,
        {"VLLM_PLUGINS": "rope_compat"}, hook_dir, extra_path=plugin_path,
    )
    assert not out["loaded_before"]
    assert out["dispatch_keys"] == ["CPU"] and out["rotates"]


def test_alias_where_vllm_is_not_importable(hook_dir):
    out = run_child(
        """
        import importlib.util, json
        import rope_compat
        from rope_compat.compat.alias import ALIAS_ORIGIN
        installed_at_start = rope_compat.patch_status().alias
        pending = rope_compat.patch_status().pending
        import vllm
        from vllm import _custom_ops
        import vllm._custom_ops as ops_again
        errors = {}
        for owner, name in ((vllm, "LLM"), (_custom_ops, "rms_norm"), (vllm, "__version__")):
            try:
                getattr(owner, name)
            except AttributeError as e:
                errors[name] = str(e)
        try:
            import vllm.distributed
        except ModuleNotFoundError as e:
            errors["vllm.distributed"] = type(e).__name__
        try:
            rope_compat.patch_vllm()
        except rope_compat.UnsupportedVllmError as e:
            errors["patch_vllm"] = str(e)
        spec = importlib.util.find_spec("vllm")
        out = {
            "installed_at_start": installed_at_start,
            "pending": pending,
            "same_module": ops_again is _custom_ops,
            "is_rope_compat": _custom_ops.rotary_embedding is rope_compat.rotary_embedding
                and _custom_ops.batched_rotary_embedding is rope_compat.batched_rotary_embedding,
            "rotates": rotates_inverse(_custom_ops.rotary_embedding),
            "spec_origin": spec.origin,
            "alias_origin": ALIAS_ORIGIN,
            "errors": errors,
            "uninstalled": rope_compat.uninstall_vllm_alias(),
            "spec_after": importlib.util.find_spec("vllm") is None,
            "reinstalled": rope_compat.install_vllm_alias(),
        }
        print(json.dumps(out))
        """,
        {ENV_VAR: "alias"}, hook_dir, hide_vllm=True,
    )
    # The alias waits for `import vllm`, so an interpreter that never imports it loads nothing.
    assert not out["installed_at_start"] and out["pending"] == ["vllm-alias"]
    assert out["same_module"] and out["is_rope_compat"]
    assert out["rotates"]
    assert out["spec_origin"] == out["alias_origin"]
    for name in ("LLM", "rms_norm", "__version__"):
        assert "provides only" in out["errors"][name] and repr(name) in out["errors"][name]
    assert out["errors"]["vllm.distributed"] == "ModuleNotFoundError"
    assert "alias" in out["errors"]["patch_vllm"]
    assert out["uninstalled"] and out["spec_after"] and out["reinstalled"]


@pytest.mark.skipif(DIST is None, reason="rope-compat is not installed (pip install -e .)")
def test_installed_hook_is_the_repository_file():
    files = [f for f in DIST.files or () if f.name == HOOK]
    assert files, f"{HOOK} is not part of the installed distribution"
    installed = Path(DIST.locate_file(files[0])).resolve()
    assert str(installed.parent) in {str(Path(p).resolve()) for p in site.getsitepackages()}
    assert installed.read_bytes() == (REPO / HOOK).read_bytes()


@pytest.mark.parametrize(
    "value", ["1", "dispatcher", "alias", "sglang", "sgl-kernel-alias", "sglang, alias,sgl-kernel-alias"]
)
def test_a_route_loads_nothing_until_its_module_is_imported(hook_dir, value):
    out = run_child(
        """
        import json, sys
        import json as _unrelated  # an interpreter that imports none of vllm, sglang, sgl_kernel
        print(json.dumps({"loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("rope_compat", "torch")),
                          "hook": "_rope_compat_startup" in sys.modules}))
        """,
        {ENV_VAR: value}, hook_dir,
    )
    assert out["loaded"] == [] and out["hook"]


def test_a_bad_value_warns_once(hook_dir):
    child_env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    child_env["PYTHONPATH"] = os.pathsep.join([str(REPO), child_env.get("PYTHONPATH", "")])
    child_env[ENV_VAR] = "sglang,bogus"
    site_line = "" if hook_dir is None else f"site.addsitedir({str(hook_dir)!r})\n"
    script = "import site; site.main()\n" + site_line + textwrap.dedent(
        """
        import sys
        from rope_compat.compat import startup
        assert startup.routes_from_env() == () and startup.route_from_env() == "off"
        print("torch" in sys.modules)
        """
    )
    proc = subprocess.run([sys.executable, "-S", "-c", script], env=child_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stderr.count("ignoring ROPE_COMPAT_PATCH='sglang,bogus'") == 1, proc.stderr


FAKE_SGLANG_ROPE = '''
def apply_rope_with_cos_sin_cache_inplace(q, k, cos_sin_cache, positions, *, is_neox, rope_dim=0, fused_args=None):
    raise AssertionError("SGLang kernel ran")
'''


def test_sglang_route_patches_when_sglangs_rope_module_is_imported(hook_dir, tmp_path):
    pkg = tmp_path / "sglang"
    for sub in ("", "kernels", "kernels/ops", "kernels/ops/attention"):
        (pkg / sub).mkdir(parents=True, exist_ok=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "kernels/ops/attention/rope.py").write_text(FAKE_SGLANG_ROPE)
    (pkg / "layer.py").write_text(
        "from sglang.kernels.ops.attention.rope import apply_rope_with_cos_sin_cache_inplace\n"
    )
    out = run_child(
        """
        import json, sys
        import sglang  # the package alone: no rope module yet
        before = "rope_compat" in sys.modules
        import sglang.layer
        import rope_compat
        from rope_compat.compat._bindings import runs_code_of
        status = rope_compat.patch_status()
        print(json.dumps({
            "before": before,
            "patched": runs_code_of(sglang.layer.apply_rope_with_cos_sin_cache_inplace,
                                    rope_compat.sglang.apply_rope_with_cos_sin_cache_inplace),
            "status": status.sglang,
            "pending": list(status.pending),
        }))
        """,
        {ENV_VAR: "sglang"}, hook_dir, extra_path=tmp_path,
    )
    assert not out["before"] and out["patched"]
    key = "sglang.kernels.ops.attention.rope.apply_rope_with_cos_sin_cache_inplace"
    assert sorted(out["status"][key]) == sorted([key, "sglang.layer.apply_rope_with_cos_sin_cache_inplace"])
    assert out["pending"] == ["sglang"]  # SGLang's older module names are still watched


def test_sgl_kernel_alias_route(hook_dir):
    out = run_child(
        """
        import importlib.util, json, sys
        real = importlib.util.find_spec("sgl_kernel") is not None
        import sgl_kernel
        import rope_compat
        try:
            from sgl_kernel import silu_and_mul
            error = None
        except ImportError as e:
            error = str(e)
        print(json.dumps({
            "real": real and not rope_compat.patch_status().sgl_kernel_alias,
            "alias": rope_compat.patch_status().sgl_kernel_alias,
            "ours": sgl_kernel.apply_rope_with_cos_sin_cache_inplace is rope_compat.apply_rope_with_cos_sin_cache_inplace,
            "error": error,
        }))
        """,
        {ENV_VAR: "sgl-kernel-alias"}, hook_dir,
    )
    if out["real"]:
        pytest.skip("a real sgl-kernel is installed")
    assert out["alias"] and out["ours"] and "provides only" in out["error"]
