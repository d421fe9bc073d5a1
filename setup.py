"""Build rope-compat: the Python package, plus the CUDA extension where it can be built.

ROPE_COMPAT_BUILD_CUDA=1 forces the CUDA build (failing loudly if it cannot), =0 skips it;
unset, it is built when the installed torch is a CUDA build and nvcc is found (CUDA_HOME).
The extension is built against the installed torch's C++ API (see csrc/ops.cpp for why not
the stable ABI), so it must be rebuilt for another torch version. Architectures come from
TORCH_CUDA_ARCH_LIST.
"""

import os

from setuptools import Command, find_packages, setup
from setuptools.command.build import build

DEFAULT_ARCHS = "8.0;9.0;10.0;12.0+PTX"


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
    ext = cpp_extension.CUDAExtension(
        name="rope_compat._C",
        sources=["csrc/ops.cpp", "csrc/rotary_embedding_kernel.cu", "csrc/fused_kv_store_kernel.cu"],
        include_dirs=[os.path.abspath("csrc")],
        extra_compile_args={
            # torch >= 2.14's headers need C++20; the .cu file includes no torch header.
            "cxx": ["-O3", "-std=c++20"],
            "nvcc": ["-O3", "-std=c++17", "-lineinfo"],
        },
    )
    return [ext], {"build_ext": cpp_extension.BuildExtension}


ext_modules, cmdclass = cuda_extensions()

STARTUP_HOOK = "rope_compat_startup.pth"


class BuildStartupHook(Command):
    """Put the start-up hook (a .pth file, read by the site module) at the wheel's root,
    which installers copy into site-packages. It does nothing unless ROPE_COMPAT_PATCH is set."""

    description = f"add {STARTUP_HOOK} to the root of the wheel"
    user_options = []

    def initialize_options(self):
        self.build_lib = None
        self.editable_mode = False

    def finalize_options(self):
        self.set_undefined_options("build_py", ("build_lib", "build_lib"))

    def run(self):
        # An editable (PEP 660) wheel carries none of build_lib, only a path finder; setuptools
        # (>= 64) points the install command at the unpacked editable wheel, so write it there.
        root = self.get_finalized_command("install").install_lib if self.editable_mode else self.build_lib
        self.copy_file(STARTUP_HOOK, os.path.join(root, STARTUP_HOOK))

    def get_outputs(self):
        return [os.path.join(self.build_lib, STARTUP_HOOK)]

    def get_source_files(self):
        return [STARTUP_HOOK]


class BuildWithStartupHook(build):
    sub_commands = build.sub_commands + [("build_startup_hook", None)]


setup(
    name="rope-compat",
    version="0.1.0",
    description="Rotary position embedding for LLM inference engines: vLLM's op without vLLM",
    packages=find_packages(include=["rope_compat", "rope_compat.*"]),
    # The start-up switch read by rope_compat_startup.pth: standard library only, outside the
    # package so that reading it imports neither torch nor rope_compat.
    py_modules=["_rope_compat_startup"],
    license="Apache-2.0",
    license_files=["LICENSE"],
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
    cmdclass={**cmdclass, "build": BuildWithStartupHook, "build_startup_hook": BuildStartupHook},
)
