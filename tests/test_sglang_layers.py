"""SGLang's own RotaryEmbedding layer on rope-compat, where SGLang is installed (CI installs
real releases; elsewhere these tests skip).

Both routes run SGLang's code, not a copy (tests/sglang_layer_child.py, one fresh interpreter
per route): its forward_cuda reaching vLLM's op through rope-compat's vllm alias (SGLang
0.4.x-0.5.x on hosts without CUDA), and its current rope entry point patched by
`patch_sglang()` with SGLang's own FusedSetKVBufferArg (0.5.20 and newer). Every config is
checked against the float64 reference and against the layer's own forward_native.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
HAS_SGLANG = importlib.util.find_spec("sglang") is not None
CONFIGS = [
    "llama-32/8x128-bf16", "llama-32/8x128-f16", "llama-32/8x128-f32", "gptj-16/16x256-rot64-f16",
    "gptj-8/8x64-full-bf16", "partial-32/32x128-rot64-bf16", "llama3-32/8x128-bf16",
    "yarn-16/4x128-f16", "yarn-16/4x128-f32",
]

pytestmark = [pytest.mark.sglang, pytest.mark.skipif(not HAS_SGLANG, reason="needs SGLang (CI installs it)")]

_runs = {}


def _child(mode: str) -> dict:
    if mode not in _runs:
        env = dict(os.environ)
        env.pop("ROPE_COMPAT_PATCH", None)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
        proc = subprocess.run(
            [sys.executable, str(TESTS / "sglang_layer_child.py"), mode],
            env=env, capture_output=True, text=True, timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        _runs[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    return _runs[mode]


def _assert_ok(results: dict) -> None:
    bad = {check: outcome for check, outcome in results.items() if outcome != "ok"}
    assert results and not bad, "\n".join(f"{k}: {v}" for k, v in bad.items())


@pytest.mark.parametrize("config", CONFIGS)
def test_forward_cuda_through_the_vllm_alias(config):
    _assert_ok(_child("alias")[config])


@pytest.mark.parametrize("config", ["setup"] + CONFIGS + ["teardown"])
def test_forward_cuda_through_patch_sglang(config):
    out = _child("patched")
    if "unavailable" in out:
        pytest.skip(f"this SGLang has no current rope entry point: {out['unavailable']}")
    _assert_ok(out[config])
