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
