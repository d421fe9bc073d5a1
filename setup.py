"""Build rope-compat: the Python package, plus the compiled extensions where they can be built.

CUDA (rope_compat._C): ROPE_COMPAT_BUILD_CUDA=1 forces the build (failing loudly if it cannot),
=0 skips it; unset, it is built when the installed torch is a CUDA build and nvcc is found
(CUDA_HOME). Architectures come from TORCH_CUDA_ARCH_LIST.

CPU (rope_compat._cpu, csrc/cpu_ops.cpp): built with the machine's C++ compiler on every
machine, CUDA or not. ROPE_COMPAT_BUILD_CPU=0 skips it, =1 fails loudly if it cannot be built;
unset, a failed build (no compiler, say) only warns, and the Torch implementation serves the
CPU. It is compiled for the instruction set torch reports for the building machine
(torch.backends.cpu.get_cpu_capability(): AVX512, AVX512_BF16 where the CPU also converts
float32 to bfloat16, AVX2, else the portable DEFAULT), or the one ROPE_COMPAT_CPU_CAPABILITY
names (set DEFAULT or AVX2 for a wheel meant for other machines); on a CPU that torch finds
less capable the module is not loaded.

Both are built against the installed torch's C++ API (see csrc/ops.cpp for why not the stable
ABI), so they must be rebuilt for another torch version.
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
        sources=["csrc/ops.cpp", "csrc/rotary_embedding_kernel.cu", "csrc/fused_kv_store_kernel.cu",
                 "csrc/mrope_kernel.cu"],
        include_dirs=[os.path.abspath("csrc")],
        extra_compile_args={
            # torch >= 2.14's headers need C++20; the .cu file includes no torch header.
            "cxx": ["-O3", "-std=c++20"],
            "nvcc": ["-O3", "-std=c++17", "-lineinfo"],
        },
    )
    return [ext], {"build_ext": cpp_extension.BuildExtension}


CPU_EXTENSION = "rope_compat._cpu"
# at::vec's instruction sets and the compiler flags torch builds its own kernels with.
_AVX512 = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma", "-mf16c"]
CPU_ISA_FLAGS = {
    # AVX512 plus the float32 -> bfloat16 conversion instruction (the bf16 store path).
    "AVX512_BF16": _AVX512 + ["-mavx512bf16"],
    "AVX512": _AVX512,
    "AVX2": ["-mavx2", "-mfma", "-mf16c"],
    "DEFAULT": [],
}


def _cpu_capability(torch) -> str:
    wanted = os.environ.get("ROPE_COMPAT_CPU_CAPABILITY", "").strip().upper()
    if wanted:
        if wanted not in CPU_ISA_FLAGS:
            raise RuntimeError(f"ROPE_COMPAT_CPU_CAPABILITY={wanted}: expected one of {', '.join(CPU_ISA_FLAGS)}")
        return wanted
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return "DEFAULT"
    found = torch.backends.cpu.get_cpu_capability().upper()
    if found.startswith("AVX512"):
        return "AVX512_BF16" if torch.cpu._is_avx512_bf16_supported() else "AVX512"
    return found if found in CPU_ISA_FLAGS else "DEFAULT"


def cpu_extensions():
    flag = os.environ.get("ROPE_COMPAT_BUILD_CPU", "").strip()
    if flag == "0":
        return []
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        if flag == "1":
            raise
        return []
    capability = _cpu_capability(torch)
    vec = capability.split("_")[0]  # at::vec's name: AVX512_BF16 is at::vec's AVX512
    major, minor = (int(v) for v in torch.__version__.split(".")[:2])
    # torch >= 2.14's headers need C++20; 2.13's compile with C++17.
    std = "-std=c++20" if (major, minor) >= (2, 14) else "-std=c++17"
    return [cpp_extension.CppExtension(
        name=CPU_EXTENSION,
        sources=["csrc/cpu_ops.cpp"],  # one translation unit: about 1-2 minutes on 2 cores
        include_dirs=[os.path.abspath("csrc")],
        extra_compile_args=[
            "-O3", std, "-fopenmp", "-fvisibility=hidden", "-Wno-maybe-uninitialized", "-Wno-unknown-pragmas",
            f"-DCPU_CAPABILITY={vec}", f"-DCPU_CAPABILITY_{vec}", f"-DROPE_CPU_CAPABILITY={capability}",
            *CPU_ISA_FLAGS[capability],
        ],
        # The OpenMP runtime is torch's own (libgomp.so.1, already loaded by libtorch_cpu).
        extra_link_args=["-fopenmp"],
    )]


def _build_ext_class():
    try:
        from torch.utils.cpp_extension import BuildExtension
    except ImportError:
        return None

    class BuildExt(BuildExtension):
        """torch's BuildExtension; a CPU extension that fails to build only warns (unless
        ROPE_COMPAT_BUILD_CPU=1) and is left out, so the package installs without it."""

        def _optional(self, ext) -> bool:
            return ext.name == CPU_EXTENSION and os.environ.get("ROPE_COMPAT_BUILD_CPU", "").strip() != "1"

        def _skip(self, ext, error) -> None:
            self.warn(f"{ext.name} not built ({type(error).__name__}: {error}); "
                      "the Torch implementation will serve the CPU")
            self.extensions.remove(ext)

        def build_extensions(self):
            self._failed = []
            try:
                super().build_extensions()
            except Exception as e:  # e.g. no C++ compiler: fails before any extension is built
                optional = [ext for ext in self.extensions if self._optional(ext)]
                if not optional or len(optional) != len(self.extensions):
                    raise
                self._failed = [(ext, e) for ext in optional]
            for ext, e in self._failed:  # left out of what is copied and installed
                self._skip(ext, e)

        def build_extension(self, ext):
            if not self._optional(ext):
                return super().build_extension(ext)
            try:
                super().build_extension(ext)
            except Exception as e:
                self._failed.append((ext, e))

    return BuildExt


ext_modules, cmdclass = cuda_extensions()
ext_modules += cpu_extensions()
if ext_modules and (build_ext_class := _build_ext_class()) is not None:
    cmdclass["build_ext"] = build_ext_class

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
