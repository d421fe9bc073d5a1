"""Timing: CUDA-graph replays on the GPU, wall clock on the CPU, eager host time per call.

Every timer takes `step(i)`, which runs the implementation once on input set i, cycles i over
the sets, and returns a `Timing` (microseconds per call: minimum, median and maximum over
repeats), so that the spread of a figure is reported beside it.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, List, NamedTuple, Optional

import torch

Step = Callable[[int], None]

# Two CPU runs of one measurement whose medians differ by more than this are flagged.
CPU_DISAGREEMENT = 0.2


class Timing(NamedTuple):
    min: float
    median: float
    max: float
    # CPU only: relative difference between the medians of two independent runs.
    disagreement: Optional[float] = None


def _timing(per_call_us: List[float], disagreement: Optional[float] = None) -> Timing:
    return Timing(min(per_call_us), statistics.median(per_call_us), max(per_call_us), disagreement)


def cuda_graph_us(
    step: Step, n_sets: int, calls_per_graph: int = 100, target_s: float = 0.2,
    min_repeats: int = 5, max_repeats: int = 50,
) -> Timing:
    """Device time per call (us) from CUDA-graph replays timed with CUDA events.

    The calls are captured into graphs of `calls_per_graph` calls each, enough graphs to
    visit every input set once; one measurement replays all graphs back to back. Graphs take
    host launch overhead out of the figure, which for decode sizes is what an engine sees;
    long graphs (100 calls or more) spread the cost of launching a graph over many calls.
    """
    # Warm up on a side stream before capture: lazy initialisation, compilation and
    # allocator growth must not happen inside the graph.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(max(n_sets, 3)):
            step(i % n_sets)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    n_graphs = -(-n_sets // calls_per_graph)
    pool = torch.cuda.graph_pool_handle()  # shared: the graphs are replayed in capture order
    graphs = []
    for g in range(n_graphs):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            for c in range(calls_per_graph):
                step((g * calls_per_graph + c) % n_sets)
        graphs.append(graph)

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def replay_all_ms() -> float:
        start.record()
        for graph in graphs:
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    replay_all_ms()  # first replay uploads the graphs
    first = replay_all_ms()
    repeats = max(min_repeats, min(max_repeats, int(target_s * 1e3 / max(first, 1e-3))))
    per_call_us = [replay_all_ms() * 1e3 / (n_graphs * calls_per_graph) for _ in range(repeats)]
    graphs.clear()  # release the graphs (and their memory pool) before the next measurement
    return _timing(per_call_us)


def eager_wall_us(step: Step, n_sets: int, calls: int = 200, warmup: int = 50, batches: int = 9) -> Timing:
    """Host wall time per call of a plain eager loop on CUDA (launch overhead included), over
    `batches` loops of `calls` calls: the host is shared, and a single loop picks up its
    interruptions."""
    for i in range(warmup):
        step(i % n_sets)
    torch.cuda.synchronize()
    per_call = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for i in range(calls):
            step(i % n_sets)
        torch.cuda.synchronize()  # drain the queue, so a device slower than the host is not hidden
        per_call.append((time.perf_counter() - t0) / calls * 1e6)
    return _timing(per_call)


def _cpu_batches(step: Step, n_sets: int, batch: int, repeats: int) -> List[float]:
    per_call = []
    for r in range(repeats):
        t0 = time.perf_counter()
        for i in range(batch):
            step((r * batch + i) % n_sets)
        per_call.append((time.perf_counter() - t0) / batch * 1e6)
    return per_call


def cpu_us(step: Step, n_sets: int, target_s: float = 0.2, repeats: int = 25) -> Timing:
    """Wall time per call (us) on the CPU: two independent runs of `repeats` short batches.

    On a shared host other processes stretch some batches, never shorten them, so the minimum
    is the steadiest figure; the median and maximum show the spread, and `disagreement` (the
    relative difference of the two runs' medians) says whether the host was steady enough.
    """
    step(0)  # warm-up: first-call allocations
    t0 = time.perf_counter()
    for i in range(3):
        step(i % n_sets)
    one = max((time.perf_counter() - t0) / 3, 1e-7)
    batch = max(1, int(target_s / (2 * repeats) / one))
    first = _cpu_batches(step, n_sets, batch, repeats)
    second = _cpu_batches(step, n_sets, batch, repeats)
    m1, m2 = statistics.median(first), statistics.median(second)
    return _timing(first + second, abs(m1 - m2) / min(m1, m2))
