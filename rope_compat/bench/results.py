"""One benchmark measurement, and the run that collects them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List


@dataclass(frozen=True)
class Result:
    model: str  # shape name, e.g. "llama3-8b"
    shape: str  # e.g. "32/8x128 rot128 neox"
    tokens: int
    device: str  # "cuda" or "cpu"
    dtype: str
    cache_dtype: str
    timing: str  # "cuda-graph" (device time per call), "eager-wall" or "cpu-wall" (host time)
    impl: str
    us: float  # microseconds per call
    bytes: int  # bytes that must move (see shapes.bytes_to_move)
    # Spread over repeats. `us` is the median on CUDA and the minimum on the CPU (see timing.py).
    us_min: float = float("nan")
    us_median: float = float("nan")
    us_max: float = float("nan")

    @property
    def tbps(self) -> float:
        """Bytes that must move per second, in TB/s."""
        return self.bytes / (self.us * 1e-6) / 1e12


@dataclass
class BenchRun:
    rows: List[Result] = field(default_factory=list)
    skipped: Dict[str, str] = field(default_factory=dict)  # peer -> why it is missing somewhere
    warnings: List[str] = field(default_factory=list)  # e.g. CPU runs that disagree
