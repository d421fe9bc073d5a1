"""The rope-compat benchmark: rope-compat beside a roofline, the Torch implementation (eager
and compiled) and other libraries' kernels, over model shapes and token counts.

    from rope_compat.bench import run, format_tables
    result = run(shapes=["llama3-8b"], tokens=[1, 1024, 131072])
    print(format_tables(result))

On CUDA: bf16 q/k sliced from a fused qkv tensor, a float32 cache of 131072 rows, random
int64 positions, at every size enough input sets to exceed twice the L2; device time per call
from CUDA-graph replays of 100 calls, plus host wall time per call of an eager loop at 1 token.
On the CPU: wall time per call, two runs of many short batches. Every figure carries its
minimum, median and maximum over repeats.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from .inputs import make_inputs, rope_cache, sets_needed
from .peers import Unsupported, peers as select_peers
from .plot import plot
from .progress import progress_bar
from .report import format_tables, write_csv
from .results import BenchRun, Result
from .external import EXTERNALS
from .shapes import CPU_TOKENS, GPU_TOKENS, MODEL_SHAPES, Shape, bytes_to_move, parse_shape
from .timing import CPU_DISAGREEMENT, Timing, cpu_us, cuda_graph_us, eager_wall_us

__all__ = ["run", "format_tables", "write_csv", "plot", "BenchRun", "Result", "Shape", "MODEL_SHAPES",
           "bytes_to_move"]

_DEFAULT_L2 = 60 * 2**20  # H200-class, when the device does not say


def _spill_bytes(device: str) -> int:
    """Bytes of input sets to cycle through so caches cannot hold them: twice the L2."""
    if device == "cuda":
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return 2 * (getattr(props, "L2_cache_size", 0) or _DEFAULT_L2)
    return 64 * 2**20  # a generous CPU last-level cache


def run(
    shapes: Optional[Sequence[Union[Shape, str]]] = None,
    tokens: Optional[Sequence[int]] = None,
    device: Optional[str] = None,
    dtype: torch.dtype = torch.bfloat16,
    cache_dtype: torch.dtype = torch.float32,
    cache_rows: int = 131072,
    peers: Optional[Sequence[str]] = None,
    calls_per_graph: int = 100,
    max_sets: Optional[int] = None,
    wall_calls: int = 200,
    target_s: float = 0.2,
    progress: bool = True,
    seed: int = 0,
) -> BenchRun:
    """Time every selected peer at every (shape, tokens) point; returns rows and skip notes.

    shapes: names from MODEL_SHAPES or 'Hq/HkxD[:rot][:neox|gptj]' specs (default: all models).
    tokens: token counts (default GPU_TOKENS on CUDA, CPU_TOKENS on the CPU).
    peers: names to compare with (default: all available; rope-compat is always timed).
    max_sets: cap on the input sets cycled through (default None: as many as it takes to exceed
        twice the L2 at every size; 1 times every call on the same, cache-warm inputs).
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    on_cuda = device == "cuda"
    shapes = [parse_shape(s) if isinstance(s, str) else s for s in (shapes or MODEL_SHAPES.values())]
    tokens = list(tokens or (GPU_TOKENS if on_cuda else CPU_TOKENS))
    chosen = select_peers(list(peers) if peers is not None else None)
    result = BenchRun()
    for ext in EXTERNALS:
        if not ext.installed() and (peers is None or ext.name in peers):
            result.skipped[ext.name] = "not installed"

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    spill = _spill_bytes(device)
    bar = progress_bar(len(shapes) * len(tokens) * len(chosen), enabled=progress, desc="rope bench")
    try:
        for shape in shapes:
            cache = rope_cache(cache_rows, shape.rot_dim, cache_dtype, device)
            for t in tokens:
                n_sets = sets_needed(shape, t, dtype, cache_dtype, spill, max_sets)
                inputs = make_inputs(shape, t, n_sets, cache, dtype, gen)
                nbytes = bytes_to_move(shape, t, dtype, cache_dtype)
                for peer in chosen:
                    bar.set_description(f"{shape.name} T={t} {peer.name}")

                    def record(timing: str, tm: Timing) -> None:
                        # The CPU's headline is the minimum: a shared host only ever slows a batch.
                        us = tm.median if on_cuda else tm.min
                        result.rows.append(Result(
                            shape.name, shape.label, t, device, str(dtype).replace("torch.", ""),
                            str(cache_dtype).replace("torch.", ""), timing, peer.name, us, nbytes,
                            tm.min, tm.median, tm.max,
                        ))
                        if tm.disagreement is not None and tm.disagreement > CPU_DISAGREEMENT:
                            result.warnings.append(
                                f"{peer.name} at {shape.name} T={t}: two runs' medians differ by "
                                f"{tm.disagreement:.0%} (> {CPU_DISAGREEMENT:.0%}); the host is busy, "
                                "re-run for steadier figures")

                    try:
                        step = peer.make(inputs)
                        if on_cuda:
                            record("cuda-graph", cuda_graph_us(step, n_sets, calls_per_graph, target_s))
                            if t == 1:
                                record("eager-wall", eager_wall_us(step, n_sets, wall_calls))
                        else:
                            record("cpu-wall", cpu_us(step, n_sets, target_s))
                    except Unsupported as why:
                        result.skipped.setdefault(peer.name, str(why))
                    except Exception as e:  # a failing peer is reported, the run goes on
                        msg = f"{type(e).__name__}: {e}".splitlines()[0]
                        result.skipped.setdefault(peer.name, f"failed at {shape.name} T={t}: {msg}")
                    bar.update()
                del inputs
                if on_cuda:
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
    finally:
        bar.close()
    return result
