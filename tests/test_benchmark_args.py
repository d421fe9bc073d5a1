"""Argument checks of the benchmark scripts in benchmarks/, which run without a GPU."""

import importlib.util
import pathlib

import pytest
import torch

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mrope_rejects_an_unknown_column(capsys):
    mrope = _script("mrope")
    with pytest.raises(SystemExit) as exit_info:
        mrope.main(["--columns", "ours,nope"])
    assert exit_info.value.code == 2
    assert "--columns: pick from " + ",".join(mrope.COLUMNS) in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["random", "image", "window"])
def test_mrope_positions_lie_in_the_cache(mode):
    mrope = _script("mrope")
    rows = mrope.draw_positions(mode, 4096, torch.Generator().manual_seed(1))
    assert rows.shape == (3, 4096) and rows.dtype == torch.long
    assert int(rows.min()) >= 0 and int(rows.max()) < mrope.CACHE_ROWS
    if mode == "image":  # height and width within the grid's span above the temporal row
        offsets = rows[1:] - rows[0]
        assert int(offsets.min()) >= 0 and int(offsets.max()) < mrope.GRID_SPAN
    if mode == "window":
        assert int(rows.max()) < mrope.WINDOW_ROWS
    else:  # the temporal rows spread over the whole cache
        assert int(rows[0].max()) > mrope.CACHE_ROWS // 2


def test_mrope_rejects_an_unknown_positions_mode(capsys):
    with pytest.raises(SystemExit) as exit_info:
        _script("mrope").main(["--positions", "grid"])
    assert exit_info.value.code == 2
    # the choices check itself, not argparse's "unrecognized arguments" (which also exits 2)
    assert "argument --positions: invalid choice: 'grid'" in capsys.readouterr().err
