"""Benchmark output: markdown tables for the terminal, and a long-format CSV."""

from __future__ import annotations

import csv
from typing import Dict, List, Optional, Tuple

from .results import BenchRun, Result

SUBJECT = "rope-compat"
_TITLES = {
    "cuda-graph": "Device time per call (us, median [min-max]), CUDA-graph replays",
    "eager-wall": "Host wall time per call (us, median [min-max]), eager loop",
    "cpu-wall": "Wall time per call (us, minimum [median-max]), CPU",
}

Key = Tuple[str, str, int]  # (timing, model, tokens)


def _subject_us(rows: List[Result]) -> Dict[Key, float]:
    return {(r.timing, r.model, r.tokens): r.us for r in rows if r.impl == SUBJECT}


def ratio(row: Result, subject_us: Dict[Key, float]) -> Optional[float]:
    """Peer time / rope-compat time at the same point: > 1 means rope-compat is faster."""
    ours = subject_us.get((row.timing, row.model, row.tokens))
    return None if ours is None else row.us / ours


def _spread(r: Result) -> str:
    """The repeats' spread beside the headline: [min-max] for a median, [median-max] for a minimum."""
    if r.us_max != r.us_max:  # NaN: a row built without repeats
        return ""
    low = r.us_median if r.timing == "cpu-wall" else r.us_min
    return f" [{low:.3g}-{r.us_max:.3g}]"


def format_tables(run: BenchRun) -> str:
    subject_us = _subject_us(run.rows)
    out = []
    for timing, title in _TITLES.items():
        rows = [r for r in run.rows if r.timing == timing]
        if not rows:
            continue
        impls = [i for i in dict.fromkeys(r.impl for r in rows) if i != SUBJECT]
        points = list(dict.fromkeys((r.model, r.shape, r.tokens) for r in rows))
        cell = {(r.model, r.tokens, r.impl): r for r in rows}
        header = ["shape", "tokens", f"{SUBJECT} us", "TB/s", *[f"{i} us (x)" for i in impls]]
        lines = [f"{title}; (x) = peer time / {SUBJECT} time", "", " | ".join(header),
                 " | ".join("---" for _ in header)]
        for model, shape, tokens in points:
            ours = cell.get((model, tokens, SUBJECT))
            line = [shape, str(tokens), f"{ours.us:.2f}{_spread(ours)}" if ours else "-",
                    f"{ours.tbps:.3g}" if ours else "-"]
            for impl in impls:
                r = cell.get((model, tokens, impl))
                x = None if r is None else ratio(r, subject_us)
                line.append("-" if r is None else f"{r.us:.2f}" + (f" ({x:.3g})" if x else "") + _spread(r))
            lines.append(" | ".join(line))
        out.append("\n".join(lines))
    if run.warnings:
        out.append("WARNING, unsteady timings:\n" + "\n".join(f"  {w}" for w in run.warnings))
    notes = [f"{name}: {why}" for name, why in run.skipped.items()]
    if notes:
        out.append("not measured everywhere:\n" + "\n".join(f"  {n}" for n in notes))
    out.append(
        "TB/s = bytes that must move / time, bytes = 2*T*(Hq+Hk)*rot_dim*elem_size "
        "+ T*pos_size + T*rot_dim*cache_elem_size."
    )
    return "\n\n".join(out)


CSV_FIELDS = (
    "model", "shape", "tokens", "device", "dtype", "cache_dtype", "timing", "impl",
    "us", "bytes", "tbps", "ratio_to_rope_compat", "us_min", "us_median", "us_max",
)


def write_csv(run: BenchRun, path: str) -> None:
    subject_us = _subject_us(run.rows)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_FIELDS)
        for r in run.rows:
            x = ratio(r, subject_us)
            w.writerow([
                r.model, r.shape, r.tokens, r.device, r.dtype, r.cache_dtype, r.timing, r.impl,
                f"{r.us:.6g}", r.bytes, f"{r.tbps:.6g}", "" if x is None else f"{x:.6g}",
                f"{r.us_min:.6g}", f"{r.us_median:.6g}", f"{r.us_max:.6g}",
            ])
