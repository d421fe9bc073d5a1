"""Argument checks of the benchmark scripts in benchmarks/, which run without a GPU."""

import importlib.util
import pathlib

import pytest

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
