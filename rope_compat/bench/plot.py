"""Time per call against token count, one panel per shape, roofline dashed (needs matplotlib)."""

from __future__ import annotations

from .results import BenchRun


def plot(run: BenchRun, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only; no display needed
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("--plot needs matplotlib: pip install 'rope-compat[plot]'") from e
    rows = [r for r in run.rows if r.timing in ("cuda-graph", "cpu-wall")]
    shapes = list(dict.fromkeys((r.model, r.shape) for r in rows))
    if not shapes:
        raise ValueError("nothing to plot: no timed rows")
    cols = min(2, len(shapes))
    nrows = -(-len(shapes) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(6.5 * cols, 4.5 * nrows), squeeze=False)
    for ax, (model, shape) in zip(axes.flat, shapes):
        mine = [r for r in rows if r.model == model]
        for impl in dict.fromkeys(r.impl for r in mine):
            pts = sorted((r.tokens, r.us) for r in mine if r.impl == impl)
            style = dict(color="black", linestyle="--") if impl == "roofline" else dict(marker="o")
            ax.plot([t for t, _ in pts], [u for _, u in pts], label=impl, **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{model}: {shape}")
        ax.set_xlabel("tokens")
        ax.set_ylabel(f"us per call ({mine[0].timing}, {mine[0].device})")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(shapes):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
