"""`rope-compat info`: versions, the compiled kernels (CUDA, CPU), devices and their backends, peers, patches."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import platform
from typing import Any, Dict, List, Optional

import torch

import rope_compat
from rope_compat.ops import extension

from rope_compat.compat.alias import ALIAS_ORIGIN

from .fatbin import cuda_archs

PEER_MODULES = {
    "vllm": "vllm", "flashinfer": "flashinfer", "sgl-kernel": "sgl_kernel", "sglang": "sglang", "triton": "triton",
}


def _installed(module: str) -> Dict[str, Any]:
    """Whether a module is importable and its distribution's version, without importing it."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    found = spec is not None
    if found and getattr(spec, "origin", None) == ALIAS_ORIGIN:
        # rope-compat's stand-in (install_vllm_alias, install_sgl_kernel_alias), not the peer
        return {"installed": False, "alias": True, "version": None}
    version = None
    if found:
        dists = importlib.metadata.packages_distributions().get(module, [])
        for dist in dists:
            try:
                version = importlib.metadata.version(dist)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return {"installed": found, "alias": False, "version": version}


def _kernel_archs(path: Optional[str]) -> Optional[List[str]]:
    return None if path is None else cuda_archs(path)


def _devices() -> List[Dict[str, Any]]:
    devices = [{"device": "cpu", "name": platform.processor() or platform.machine(),
                "backend": rope_compat.backend_for("cpu")}]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            devices.append({
                "device": f"cuda:{i}",
                "name": torch.cuda.get_device_name(i),
                "capability": f"sm_{major}{minor}",
                "backend": rope_compat.backend_for(f"cuda:{i}"),
            })
    return devices


def _patches() -> Any:
    status = getattr(rope_compat, "patch_status", None)
    if status is None:
        return "compat layer not available"
    try:
        state = status()
    except Exception as e:  # info must always print; a broken status is itself information
        return f"patch_status() failed: {type(e).__name__}: {e}"
    if dataclasses.is_dataclass(state):
        fields = dataclasses.asdict(state)
        if hasattr(state, "patched"):
            fields = {"patched": state.patched, **fields}
        return fields
    return state


def collect() -> Dict[str, Any]:
    """Everything `info` reports, as plain JSON-serialisable data."""
    path = extension.library_path()
    return {
        "rope_compat": rope_compat.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "torch_cuda_archs": torch.cuda.get_arch_list() if torch.version.cuda else [],
        "kernel": {
            "loaded": extension.has_cuda_kernel(),
            "library": path,
            "load_error": extension.load_error(),
            # Read from the library's fat binary; None when there is no library or it has none.
            "cuda_archs": _kernel_archs(path),
        },
        "cpu_kernel": {
            "loaded": extension.has_cpu_kernel(),
            "library": extension.cpu_library_path(),
            "load_error": extension.cpu_load_error(),
            "cpu_capability": extension.cpu_capability(),
        },
        "devices": _devices(),
        "peers": {name: _installed(module) for name, module in PEER_MODULES.items()},
        "patches": _patches(),
    }


def _text(info: Dict[str, Any]) -> str:
    k = info["kernel"]
    kernel = "loaded" if k["loaded"] else f"not loaded ({k['load_error']})"
    archs = ", ".join(k["cuda_archs"]) if k["cuda_archs"] else "unknown"
    c = info["cpu_kernel"]
    cpu_kernel = f"loaded ({c['cpu_capability']})" if c["loaded"] else f"not loaded ({c['load_error']})"
    lines = [
        f"rope-compat {info['rope_compat']}",
        f"python      {info['python']}",
        f"torch       {info['torch']} (CUDA {info['torch_cuda'] or 'none'}; "
        f"archs: {', '.join(info['torch_cuda_archs']) or 'none'})",
        f"kernel      {kernel}",
        f"  library   {k['library'] or 'none'}",
        f"  archs     {archs if k['library'] else 'n/a'}",
        f"cpu kernel  {cpu_kernel}",
        f"  library   {c['library'] or 'none'}",
        "devices:",
    ]
    for d in info["devices"]:
        cap = f" {d['capability']}" if "capability" in d else ""
        lines.append(f"  {d['device']:<8} {d['name']}{cap} -> backend: {d['backend']}")
    lines.append("peers:")
    for name, p in info["peers"].items():
        if p.get("alias"):
            state = ALIAS_ORIGIN
        else:
            state = f"installed {p['version'] or ''}".strip() if p["installed"] else "not installed"
        lines.append(f"  {name:<11} {state}")
    patches = info["patches"]
    if isinstance(patches, dict):
        lines.append("patches:")
        lines += [f"  {name}: {value}" for name, value in patches.items()] or ["  none"]
    else:
        lines.append(f"patches:    {patches}")
    return "\n".join(lines)


def main(args) -> int:
    info = collect()
    print(json.dumps(info, indent=2, default=str) if args.json else _text(info))
    return 0
