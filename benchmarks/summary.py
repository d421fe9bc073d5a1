"""Print the README's GPU table from one `rope-compat bench --csv` file.

Every ratio is a speed-up of rope-compat (peer time / rope-compat time) measured in that one
run; a peer that was not installed for the run gets no column. Times are medians over repeats,
with rope-compat's minimum and maximum beside them.
Usage: python benchmarks/summary.py bench.csv
"""

import csv
import sys
from collections import defaultdict

PEERS = ["roofline", "contiguous floor", "torch eager", "torch.compile", "flashinfer", "sgl-kernel", "vllm"]


def main(path: str) -> None:
    table = defaultdict(dict)
    wall = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            if r["timing"] == "cuda-graph":
                table[(r["shape"], int(r["tokens"]))][r["impl"]] = r
            elif r["timing"] == "eager-wall" and r["impl"] == "rope-compat":
                wall[r["shape"]] = float(r["us"])
    present = [p for p in PEERS if any(p in impls for impls in table.values())]
    print("shape | T | us | min-max | TB/s | " + " | ".join(f"x {p}" for p in present))
    print("---|---|---|---|---|" + "---|" * len(present))
    for (shape, t), impls in sorted(table.items()):
        ours = impls.get("rope-compat")
        if ours is None:
            continue
        us = float(ours["us"])
        spread = f"{float(ours['us_min']):.2f}-{float(ours['us_max']):.2f}" if ours.get("us_min") else "-"
        ratios = [f"{float(impls[p]['us']) / us:.2f}" if p in impls else "-" for p in present]
        print(f"{shape} | {t} | {us:.2f} | {spread} | {float(ours['tbps']):.2f} | " + " | ".join(ratios))
    for shape, us in wall.items():
        print(f"eager host wall per call at 1 token, {shape}: {us:.2f} us")


if __name__ == "__main__":
    main(sys.argv[1])
