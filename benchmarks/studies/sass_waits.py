"""Where does a kernel's thread wait for its loads? Loads, stores, branches and every instruction
that waits on a scoreboard, from the SASS of a compiled sm_90 (or other Volta-and-newer) binary.

A global load sets one of six scoreboards when it is issued ("sb=N"); an instruction that needs
its result waits on that scoreboard ("waits N"). A wait between two loads means the second is
issued only after the first has returned, whatever the source order says. Loads issued together
often share a scoreboard, so a wait releases when all of them are back.

Usage: python benchmarks/studies/sass_waits.py BINARY FUNCTION_SUBSTRING
  BINARY: a .cubin, an executable or the extension's .so; FUNCTION_SUBSTRING picks the kernels,
  e.g. 'rotary_kernelI13__nv_bfloat16fLi8ELi1E' (bf16 q/k, f32 cache, 8-element vectors, one
  head per thread). cuobjdump comes from $CUOBJDUMP, PATH, $CUDA_HOME/bin or triton's copy.
"""

import glob
import os
import re
import shutil
import subprocess
import sys
from typing import Iterator, List, Tuple

# The control bits of a 128-bit Volta+ instruction live in bits 105-125, i.e. from bit 41 of its
# second 64-bit word: stall (4 bits), yield (1), write scoreboard (3), read scoreboard (3),
# wait mask (6), register reuse (4). Scoreboard 7 means none.
CONTROL_SHIFT = 41


def cuobjdump() -> str:
    candidates = [os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump")]
    candidates.append(os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "cuobjdump"))
    try:
        import triton

        candidates += glob.glob(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump"))
    except ImportError:
        pass
    for c in candidates:
        if c and os.path.isfile(c):
            return c
    sys.exit("cuobjdump not found: set CUOBJDUMP")


def instructions(sass: str, function: str) -> Iterator[Tuple[str, str, str, int, List[int]]]:
    """(function, address, text, write scoreboard or -1, waited scoreboards) per instruction."""
    lines = sass.split("\n")
    current = None
    for i, line in enumerate(lines):
        if "Function : " in line:
            name = line.split("Function : ", 1)[1].strip()
            current = name if function in name else None
            continue
        if current is None:
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s*(.*?)\s*;\s*/\* (0x[0-9a-f]+) \*/", line)
        if not m or i + 1 >= len(lines):
            continue
        hi = re.search(r"/\* (0x[0-9a-f]+) \*/", lines[i + 1])
        if not hi:
            continue
        control = int(hi.group(1), 16) >> CONTROL_SHIFT
        write = (control >> 5) & 7
        waits = [b for b in range(6) if (control >> 11) >> b & 1]
        yield current, m.group(1), m.group(2), (write if write != 7 else -1), waits


def main(binary: str, function: str) -> int:
    sass = subprocess.run([cuobjdump(), "-sass", binary], check=True, capture_output=True, text=True).stdout
    shown = None
    for fn, addr, text, write, waits in instructions(sass, function):
        if fn != shown:
            print(f"\n{fn}")
            shown = fn
        memory = re.search(r"\b(LDG|STG|LDS|STS|LD|ST|ATOM|RED)\b", text) is not None
        if memory or waits or re.search(r"\b(BRA|EXIT|ACQBULK|PREEXIT)\b", text):
            sb = f"sb={write}" if write >= 0 else "    "
            wait = f"waits {','.join(map(str, waits))}" if waits else ""
            print(f"  {addr}  {sb:5} {wait:10} {text}")
    if shown is None:
        print(f"no function matching {function!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
