"""The README's Python examples run as written (a new user's first contact)."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_python_blocks_run(tmp_path):
    with open(os.path.join(ROOT, "README.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)
    assert blocks, "README has no python example"
    for i, code in enumerate(blocks):
        script = tmp_path / f"example_{i}.py"
        script.write_text(code + "\nprint('example ran')\n")
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.pop("ROPE_COMPAT_PATCH", None)
        out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0 and "example ran" in out.stdout, out.stderr


def _readme() -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return f.read()


def test_readme_is_short():
    assert len(_readme().splitlines()) <= 250


def test_readme_setup_commands_are_ci_and_cpu_gets_cpu_torch():
    # Two blocks, GPU then CPU machine: a set-up line and the test command each. CI (.ci/run)
    # runs the CPU block's set-up line as written (quieted with -q), so the README cannot drift.
    blocks = [b.strip().splitlines() for b in re.findall(r"```bash\n(.*?)```", _readme(), flags=re.S)]
    setups = [b for b in blocks if len(b) == 2 and b[1] == "python -m pytest -q"]
    assert len(setups) == 2, blocks
    gpu, cpu = setups[0][0], setups[1][0]
    assert "download.pytorch.org/whl/cpu" in cpu and "download.pytorch.org" not in gpu
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        ci = f.read()
    assert cpu.replace("pip install ", "pip install -q ") in ci


def test_readme_local_links_exist():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", _readme())
    local = [link for link in links if not link.startswith("http")]
    assert local, "README links to nothing in the repository"
    missing = [link for link in local if not os.path.exists(os.path.join(ROOT, link))]
    assert not missing, missing
