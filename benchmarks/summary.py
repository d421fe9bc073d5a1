"""Print the short GPU table from a `rope-compat bench --csv` file.

Ratios are speed-ups of rope-compat (peer time / rope-compat time) measured in the same run,
except the FlashInfer and vLLM columns, which compare with anchors_h200.json: their kernels
measured on an H200 on 2026-12-02 with the same harness (another run, same machine type).
Usage: python benchmarks/summary.py bench.csv
"""

import csv
import json
import os
import sys
from collections import defaultdict


def main(path: str) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "anchors_h200.json")) as f:
        anchors = {(r["model"], r["T"]): r for r in json.load(f)["rows"]}
    table = defaultdict(dict)
    wall = {}
    with open(path) as f:
        for r in csv.DictReader(f):
            if r["timing"] == "cuda-graph":
                table[(r["shape"], int(r["tokens"]))][r["impl"]] = (float(r["us"]), float(r["tbps"]))
            elif r["timing"] == "eager-wall" and r["impl"] == "rope-compat":
                wall[r["shape"]] = float(r["us"])
    cols = ["roofline", "contiguous floor", "torch eager", "torch.compile"]
    print("shape | T | us | TB/s | x roofline | x contig floor | x eager | x compile | x flashinfer* | x vllm*")
    print("---|---|---|---|---|---|---|---|---|---")
    for (shape, t), impls in sorted(table.items()):
        if "rope-compat" not in impls:
            continue
        us, tbps = impls["rope-compat"]
        ratios = [f"{impls[c][0] / us:.2f}" if c in impls else "-" for c in cols]
        a = anchors.get((shape, t))
        fi = f"{a['flashinfer'] / us:.2f}" if a else "-"
        vl = f"{min(a['vllm(bf16 cache)'], a['vllm(f32 cache)']) / us:.2f}" if a else "-"
        print(f"{shape} | {t} | {us:.2f} | {tbps:.2f} | " + " | ".join(ratios) + f" | {fi} | {vl}")
    for shape, us in wall.items():
        print(f"eager host wall per call at 1 token, {shape}: {us:.2f} us")
    print("* anchors: same GPU model and harness, measured in another run (benchmarks/anchors_h200.json)")


if __name__ == "__main__":
    main(sys.argv[1])
