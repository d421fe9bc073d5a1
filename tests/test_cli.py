"""The command line (`python -m rope_compat info | verify | bench`) and the benchmark machinery.

CPU only: the CLI is run as a subprocess where its exit status and printed output are the
contract, in-process where a wrong implementation has to be injected.
"""

import csv
import importlib.util
import json
import os
import struct
import subprocess
import sys

import pytest
import torch

import rope_compat
from rope_compat.bench import bytes_to_move, run
from rope_compat.bench.inputs import make_inputs, rope_cache
from rope_compat.bench.peers import compile_torch_rope
from rope_compat.bench.torch_rope import torch_rope
from rope_compat.cli import main
from rope_compat.bench.shapes import MODEL_SHAPES, parse_shape, parse_tokens
from rope_compat.cli import verify as verify_cmd
from rope_compat.cli.fatbin import cuda_archs
from rope_compat.cli.reference import rope_reference as complex_reference

from cases import LAYOUTS, make_case
from reference import rope_reference
from tolerances import assert_matches_reference
from vllm_env import vllm_importable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(REPO, "tests")


def cli(*args, extra_path=()):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, *extra_path, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-m", "rope_compat", *args], capture_output=True, text=True, env=env, timeout=300
    )


# Deliberately wrong implementations of the op, for verify to catch.
def rotary_wrong_direction(positions, query, key, head_size, cache, is_neox, rope_dim_offset=0, inverse=False):
    rope_compat.rotary_embedding(positions, query, key, head_size, cache, is_neox, rope_dim_offset, not inverse)


def rotary_wrong_style(positions, query, key, head_size, cache, is_neox, rope_dim_offset=0, inverse=False):
    rope_compat.rotary_embedding(positions, query, key, head_size, cache, not is_neox, rope_dim_offset, inverse)


def rotary_touches_passthrough(positions, query, key, head_size, cache, is_neox, rope_dim_offset=0, inverse=False):
    rope_compat.rotary_embedding(positions, query, key, head_size, cache, is_neox, rope_dim_offset, inverse)
    heads = query.unflatten(-1, (-1, head_size)) if query.dim() == positions.dim() + 1 else query
    end = rope_dim_offset + cache.shape[1]
    if end < head_size:  # a tiny change where nothing may change at all
        heads[..., end:] *= 1.0009765625


def rotary_raises(*args):
    raise RuntimeError("no kernel image")


# --- info --------------------------------------------------------------------------------

def test_info_prints_versions_kernel_and_backends():
    r = cli("info")
    assert r.returncode == 0, r.stderr
    assert f"rope-compat {rope_compat.__version__}" in r.stdout
    assert torch.__version__ in r.stdout
    assert f"-> backend: {rope_compat.backend_for('cpu')}" in r.stdout
    assert ("kernel      loaded" in r.stdout) == rope_compat.has_cuda_kernel()
    for peer in ("vllm", "flashinfer", "sgl-kernel"):
        assert f"  {peer}" in r.stdout
    assert "patches" in r.stdout


def test_info_json(capsys):
    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["torch"] == torch.__version__
    assert info["kernel"]["loaded"] == rope_compat.has_cuda_kernel()
    assert info["devices"][0] == {**info["devices"][0], "device": "cpu", "backend": rope_compat.backend_for("cpu")}
    assert info["peers"]["vllm"]["installed"] == (importlib.util.find_spec("vllm") is not None)


def _elf_with_fatbin(path, entries):
    """A minimal ELF64 file whose `.nv_fatbin` section lists (kind, arch) entries."""
    body = b""
    for kind, arch in entries:
        payload = b"\x00" * 24
        header = struct.pack("<HHIQII", kind, 0x101, 64, len(payload), 0, 0) + struct.pack("<HHI", 0, 0, arch)
        body += header.ljust(64, b"\x00") + payload
    fatbin = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body
    names = b"\x00.shstrtab\x00.nv_fatbin\x00"
    data_off = 64
    names_off = data_off + len(fatbin)
    sh_off = names_off + len(names)
    elf = bytearray(b"\x7fELF\x02\x01\x01" + b"\x00" * 9)
    elf += struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, sh_off, 0, 64, 0, 0, 64, 3, 1)
    section = lambda name, off, size: struct.pack("<IIQQQQIIQQ", name, 1, 0, 0, off, size, 0, 0, 1, 0)
    content = bytes(elf) + fatbin + names
    content += b"\x00" * 64 + section(1, names_off, len(names)) + section(11, data_off, len(fatbin))
    path.write_bytes(content)


def test_fatbin_archs(tmp_path):
    lib = tmp_path / "lib.so"
    _elf_with_fatbin(lib, [(2, 90), (2, 80), (1, 90), (2, 90)])
    assert cuda_archs(str(lib)) == ["sm_80", "sm_90", "compute_90"]
    other = tmp_path / "other.so"
    other.write_bytes(b"not an ELF file")
    assert cuda_archs(str(other)) is None


# --- verify ------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("inverse", [False, True])
def test_verify_reference_agrees_with_test_reference(layout, is_neox, inverse):
    case = make_case(tokens=(2, 9), head_size=96, rot_dim=32, rope_dim_offset=16, layout=layout,
                     is_neox=is_neox, inverse=inverse, dtype=torch.bfloat16)
    for ours, theirs in zip(complex_reference(*case.args()), rope_reference(*case.args())):
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def test_verify_passes_and_exits_zero():
    r = cli("verify", "--device", "cpu")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = [line for line in r.stdout.splitlines() if line.startswith("cpu |")]
    assert len(rows) == len(verify_cmd.cases())
    assert all(line.endswith("| PASS") for line in rows)
    assert f"rope-compat: {len(rows)}/{len(rows)} cases PASS" in r.stdout
    if vllm_importable():  # vLLM's CPU kernel agrees where it runs
        assert "vllm err/tol" in r.stdout and "vllm: 0/" not in r.stdout
        assert not any("FAIL" in line for line in rows)


def test_verify_cli_fails_a_wrong_implementation():
    r = cli("verify", "--device", "cpu", "--no-external", "--impl", "test_cli:rotary_wrong_direction",
            extra_path=[TESTS])
    assert r.returncode == 1
    assert "FAIL" in r.stdout


@pytest.mark.parametrize("wrong, expect", [
    (rotary_wrong_direction, "err/tol"),
    (rotary_wrong_style, "err/tol"),
    (rotary_touches_passthrough, "pass-through dims changed"),
    (rotary_raises, "raised RuntimeError"),
])
def test_verify_catches_wrong_implementations(wrong, expect):
    sample = verify_cmd.cases()[::3]  # every geometry, dtype pair, style and layout still appears
    outcomes = [verify_cmd.run_case(c, "cpu", wrong, seed) for seed, c in enumerate(sample)]
    failed = [o for o in outcomes if not o.ok]
    assert failed
    if expect == "err/tol":
        assert all(o.err_over_tol > 1 for o in failed)
    else:
        assert all(expect in o.note for o in failed)


# --- bench -------------------------------------------------------------------------------

def test_shape_and_token_parsing():
    assert parse_shape("llama3-8b") == MODEL_SHAPES["llama3-8b"]
    s = parse_shape("4/2x64:32:gptj")
    assert (s.heads, s.kv_heads, s.head_size, s.rot_dim, s.is_neox) == (4, 2, 64, 32, False)
    assert parse_shape("8/8x128").rot_dim == 128 and parse_shape("8/8x128").is_neox
    for bad in ("4/3x64", "4/2x64:96", "llama"):
        with pytest.raises(ValueError):
            parse_shape(bad)
    assert parse_tokens("1,16,1024") == [1, 16, 1024]
    assert parse_tokens("8-64") == [8, 16, 32, 64]
    for bad, why in (("0", "at least 1"), ("4,0", "at least 1"), ("8-2", "no power of two"),
                     ("abc", "expected counts"), ("-1", "expected counts"), ("1,,2", "expected counts")):
        with pytest.raises(ValueError, match=why):
            parse_tokens(bad)


@pytest.mark.parametrize("argv, option", [
    (["--tokens", "0"], "--tokens"),
    (["--tokens", "8-2"], "--tokens"),
    (["--shapes", "llama3-8b,foo"], "--shapes"),
    (["--shapes", "4/3x64"], "--shapes"),
    (["--peers", "torch eager,nope"], "--peers"),
])
def test_bench_rejects_bad_lists_before_running(argv, option, capsys, monkeypatch):
    from rope_compat.cli import bench as bench_cmd

    monkeypatch.setattr(bench_cmd, "run", lambda **kw: pytest.fail("ran despite a bad argument"))
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--device", "cpu", *argv])
    assert exc.value.code == 2
    assert f"argument {option}" in capsys.readouterr().err


def test_run_rejects_unknown_peer_names():
    with pytest.raises(ValueError, match=r"unknown peers \['nope'\]; known: roofline, "):
        run(peers=["torch eager", "nope"], device="cpu")


def test_bench_plot_without_matplotlib_fails_before_running(tmp_path, capsys, monkeypatch):
    import importlib.util as iu

    from rope_compat.cli import bench as bench_cmd

    real_find_spec = iu.find_spec
    monkeypatch.setattr(iu, "find_spec", lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a))
    monkeypatch.setattr(bench_cmd, "run", lambda **kw: pytest.fail("ran although the plot cannot be drawn"))
    assert main(["bench", "--device", "cpu", "--plot", str(tmp_path / "x.png")]) == 2
    assert "--plot needs matplotlib" in capsys.readouterr().err


def test_bytes_to_move_counts_only_rotated_qk_positions_and_cache_rows():
    s = MODEL_SHAPES["partial-rotary"]  # 32/32 x128, rot 64: pass-through halves must not count
    t = 1000
    qk = 2 * t * (32 + 32) * 64 * 2  # bf16, read + write
    assert bytes_to_move(s, t, torch.bfloat16, torch.float32) == qk + t * 8 + t * 64 * 4


def test_roofline_view_is_exactly_the_rotated_elements():
    shape = parse_shape("4/2x64:24:gptj")
    cache = rope_cache(64, shape.rot_dim, torch.float32, "cpu")
    (s,) = make_inputs(shape, 5, 1, cache, torch.float32, torch.Generator().manual_seed(0)).sets
    s.rotated.fill_(float("nan"))
    heads = s.qkv.unflatten(-1, (-1, shape.head_size))
    marked = heads.isnan()
    assert marked[:, : shape.heads + shape.kv_heads, : shape.rot_dim].all()
    assert marked.sum() == 5 * (shape.heads + shape.kv_heads) * shape.rot_dim
    assert s.query.data_ptr() == s.qkv.data_ptr() and s.key.stride() == s.qkv.stride()


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("compiled", [False, True])
def test_torch_rope_of_the_compile_peer(is_neox, compiled):
    # The GPU benchmark compiles it with fullgraph=True; a graph break would fail here too.
    case = make_case(tokens=(33,), heads=4, kv_heads=2, head_size=64, rot_dim=32, layout="fused_flat",
                     is_neox=is_neox, dtype=torch.bfloat16)
    expected_q, expected_k = rope_reference(*case.args())
    fn = compile_torch_rope(backend="aot_eager") if compiled else torch_rope
    fn(case.positions, case.query, case.key, case.cos_sin_cache, case.head_size, is_neox)
    assert_matches_reference(case.query, expected_q)
    assert_matches_reference(case.key, expected_k)


def test_bench_cli_table_and_csv(tmp_path):
    out = tmp_path / "bench.csv"
    r = cli("bench", "--device", "cpu", "--shapes", "4/2x64:32:gptj", "--tokens", "1,8",
            "--peers", "roofline,torch eager,torch.compile",
            "--cache-rows", "512", "--target-s", "0.01", "--csv", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "rope-compat us | TB/s | roofline us (x) | torch eager us (x)" in r.stdout
    assert "torch.compile: CUDA only" in r.stdout
    rows = list(csv.DictReader(out.open()))
    impls = {row["impl"] for row in rows}
    assert {"rope-compat", "roofline", "torch eager"} <= impls
    assert {int(row["tokens"]) for row in rows} == {1, 8}
    for row in rows:
        t = int(row["tokens"])
        assert int(row["bytes"]) == 2 * t * 6 * 32 * 2 + t * 8 + t * 32 * 4
        assert float(row["us"]) > 0 and float(row["tbps"]) > 0 and float(row["ratio_to_rope_compat"]) > 0
        assert row["timing"] == "cpu-wall" and row["dtype"] == "bfloat16"
        lo, med, hi = float(row["us_min"]), float(row["us_median"]), float(row["us_max"])
        assert 0 < lo <= med <= hi and float(row["us"]) == pytest.approx(lo, rel=1e-5)


def test_bench_max_sets_reaches_the_runner(monkeypatch):
    # --max-sets 1 is the warm-L2 condition of the README's comparison; it must not be dropped.
    from rope_compat.bench import BenchRun
    from rope_compat.cli import bench as bench_cmd

    seen = {}
    monkeypatch.setattr(bench_cmd, "run", lambda **kw: seen.update(kw) or BenchRun())
    main(["bench", "--device", "cpu", "--max-sets", "1", "--no-progress"])
    assert seen["max_sets"] == 1
    main(["bench", "--device", "cpu", "--no-progress"])
    assert seen["max_sets"] is None  # no cap: enough sets to exceed twice the L2 at every size
    assert seen["calls_per_graph"] == 100


@pytest.mark.parametrize("option", ["--max-sets", "--calls-per-graph", "--cache-rows"])
def test_bench_rejects_counts_below_one(option, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--device", "cpu", option, "0"])
    assert exc.value.code == 2
    assert option in capsys.readouterr().err


def test_bench_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    from rope_compat.bench import plot

    result = run(shapes=["4/2x64:32", "2/1x64"], tokens=[1, 4], device="cpu", cache_rows=128,
                 peers=["roofline"], target_s=0.005, progress=False)
    path = tmp_path / "bench.png"
    plot(result, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
