"""The migration guide's examples run, check themselves and print what the guide says.

Each example is a script that asserts its own results against a float64 computation, so a
change in rope-compat that breaks a migration path fails here. Examples run as a reader runs
them: a separate process, PYTHONPATH set to the repository root. All are started together,
which roughly halves the wall time on a two-core machine; each test then waits for its own.
"""

import os
import re
import subprocess
import sys
from typing import Dict, Iterator, List, NamedTuple, Tuple

import pytest
from vllm_env import vllm_importable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GUIDE = os.path.join(REPO, "migration_guide")
EXAMPLES = os.path.join(GUIDE, "examples")
HAS_VLLM = vllm_importable()

# Runs a script with vLLM made unimportable first (`import vllm` raises ModuleNotFoundError,
# `find_spec("vllm")` returns None), as in an environment without vLLM.
WITHOUT_VLLM = (
    "import os, runpy, sys; sys.modules['vllm'] = None; "
    "script = sys.argv[1]; sys.argv = sys.argv[1:]; sys.path.insert(0, os.path.dirname(script)); "
    "runpy.run_path(script, run_name='__main__')"
)


class Example(NamedTuple):
    script: str
    promises: List[str]  # lines its output must contain
    hide_vllm: bool = False
    needs_vllm: bool = False


EXAMPLE_RUNS = {
    "from_vllm_op": Example("from_vllm_op.py", [
        "vLLM op -> rope_compat.rotary_embedding: fused bf16 qkv, float32 cache: OK",
        "vLLM op -> rope_compat.rotary_embedding: GPT-J, partial rotation, key=None: OK",
        "vLLM op -> rope_compat.rotary_embedding: rope_dim_offset and inverse: OK",
        "vLLM batched_rotary_embedding -> rope_compat.batched_rotary_embedding: OK",
    ]),
    "from_flashinfer": Example("from_flashinfer.py", [
        "flashinfer apply_rope_with_cos_sin_cache[_inplace] -> same names in rope_compat: OK",
        "flashinfer apply_rope_pos_ids(rope_scale, rope_theta) -> cache builder + cache API: OK",
        "flashinfer apply_rope_inplace(indptr, offsets) -> positions_from_offsets + rotary_embedding: OK",
        "flashinfer apply_llama31_rope_pos_ids_inplace -> llama3 cache + cache API: OK",
    ]),
    "from_sgl_kernel": Example("from_sgl_kernel.py", [
        "sgl_kernel apply_rope_with_cos_sin_cache_inplace(fused_set_kv_buffer_arg) -> rope_compat: OK",
    ]),
    "get_rope_from_hf_config": Example("get_rope_from_hf_config.py", [
        "get_rope(Llama 3.1 config) -> rope_compat.get_rope: OK",
        "get_rope(partial_rotary_factor config) -> rope_compat.get_rope: OK",
    ]),
    "switch_with_alias": Example("switch_with_alias.py", [
        "vllm._custom_ops.rotary_embedding via install_vllm_alias(): OK",
        "uninstall_vllm_alias(): rolled back: OK",
    ], hide_vllm=True),
    "switch_with_alias beside a real vLLM": Example("switch_with_alias.py", [
        "a real vLLM is installed, so no alias",  # it stops instead of shadowing vLLM
    ], needs_vllm=True),
    "switch_with_patch": Example("switch_with_patch.py", [
        "patch_vllm(): vllm._custom_ops.rotary_embedding runs rope-compat: OK",
        "unpatch_vllm(): vLLM's own function is back: OK",
        "runs rope-compat: OK",  # the dispatcher line names the dispatch keys, which vary
        "vllm_patched() block left: vLLM's kernel is back: OK",
    ], needs_vllm=True),
    "precision_long_context": Example("precision_long_context.py", [
        "| positions | bf16 cache | fp16 cache | fp32 cache | fp32 math |",
        "checked: caches built in float64 stay within half an ulp at every position; float32 angles "
        "drift with position; fp32 < fp16 < bf16 everywhere: OK",
    ]),
}


def _start(example: Example) -> subprocess.Popen:
    script = os.path.join(EXAMPLES, example.script)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    env.pop("ROPE_COMPAT_PATCH", None)  # the examples switch explicitly
    argv = [sys.executable, "-c", WITHOUT_VLLM, script] if example.hide_vllm else [sys.executable, script]
    return subprocess.Popen(
        argv, cwd=EXAMPLES, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


class Runs:
    """The example processes, started together; each one's output is read once, when needed."""

    def __init__(self, names):
        self._procs = {name: _start(EXAMPLE_RUNS[name]) for name in names}
        self._results: Dict[str, Tuple[int, str, str]] = {}

    def output(self, name: str) -> str:
        """The stdout of a run that exited 0 (fails the test otherwise)."""
        if name not in self._results:
            proc = self._procs[name]
            out, err = proc.communicate(timeout=300)
            self._results[name] = (proc.returncode, out, err)
        returncode, out, err = self._results[name]
        assert returncode == 0, f"{name} exited with {returncode}:\n{out}\n{err}"
        return out

    def stop(self) -> None:
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


@pytest.fixture(scope="module")
def runs() -> Iterator[Runs]:
    started = Runs([name for name, ex in EXAMPLE_RUNS.items() if HAS_VLLM or not ex.needs_vllm])
    yield started
    started.stop()


@pytest.mark.parametrize("name", list(EXAMPLE_RUNS))
def test_example_runs_and_prints_its_promises(runs, name):
    if EXAMPLE_RUNS[name].needs_vllm and not HAS_VLLM:
        pytest.skip("needs vLLM")
    out = runs.output(name)
    for line in EXAMPLE_RUNS[name].promises:
        assert line in out, f"{name} did not print {line!r}:\n{out}"


def test_every_example_is_run():
    scripts = {f for f in os.listdir(EXAMPLES) if f.endswith(".py") and f != "reference64.py"}
    assert scripts == {ex.script for ex in EXAMPLE_RUNS.values()}


def test_readme_quotes_the_precision_table_the_example_prints(runs):
    """The guide's cache-entry error table is the one the example prints, row for row."""
    out = runs.output("precision_long_context")
    rows = re.findall(r"^\| [\d,]+ - [\d,]+ \|.*$", out.split("max |rotated query")[0], re.M)
    assert len(rows) == 5, out
    with open(os.path.join(GUIDE, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    for row in rows:
        assert row in readme, f"README.md does not quote this row of the example's output:\n{row}"
