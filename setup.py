"""Build rope-compat: the Python package, plus the CUDA extension where it can be built.

ROPE_COMPAT_BUILD_CUDA=1 forces the CUDA build (failing loudly if it cannot), =0 skips it;
unset, it is built when the installed torch is a CUDA build and nvcc is found (CUDA_HOME).
The extension targets PyTorch's stable ABI (torch >= 2.10), so one build serves several
torch versions. Architectures come from TORCH_CUDA_ARCH_LIST.
"""

import os

from setuptools import find_packages, setup

DEFAULT_ARCHS = "8.0;9.0;10.0;12.0+PTX"
STABLE_ABI_TARGET = "0x020a000000000000"  # torch 2.10: the oldest stable ABI we rely on


def cuda_extensions():
    flag = os.environ.get("ROPE_COMPAT_BUILD_CUDA", "").strip()
    if flag == "0":
        return [], {}
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        if flag == "1":
            raise
        return [], {}
    if torch.version.cuda is None or cpp_extension.CUDA_HOME is None:
        if flag == "1":
            raise RuntimeError(
                "ROPE_COMPAT_BUILD_CUDA=1 but torch is not a CUDA build or CUDA_HOME/nvcc is missing"
            )
        return [], {}
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", DEFAULT_ARCHS)
    define = [f"-DTORCH_TARGET_VERSION={STABLE_ABI_TARGET}"]
    ext = cpp_extension.CUDAExtension(
        name="rope_compat._C",
        sources=["csrc/ops.cpp", "csrc/rotary_embedding_kernel.cu"],
        include_dirs=[os.path.abspath("csrc")],
        extra_compile_args={
            "cxx": ["-O3", "-std=c++20", *define],
            "nvcc": ["-O3", "-std=c++17", "-lineinfo", *define],
        },
        py_limited_api=True,
    )
    return [ext], {"build_ext": cpp_extension.BuildExtension}


ext_modules, cmdclass = cuda_extensions()

setup(
    name="rope-compat",
    version="0.1.0",
    description="Rotary position embedding for LLM inference engines: vLLM's op without vLLM",
    packages=find_packages(include=["rope_compat", "rope_compat.*"]),
    python_requires=">=3.10",
    install_requires=["torch>=2.10"],
    extras_require={
        "test": ["pytest", "hypothesis", "numpy", "expecttest"],
        "plot": ["matplotlib"],
    },
    entry_points={
        "console_scripts": ["rope-compat=rope_compat.cli:main"],
        "vllm.general_plugins": ["rope_compat=rope_compat.compat.plugin:register"],
    },
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
