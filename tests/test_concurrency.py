"""Concurrency: patching vLLM from several threads, and the op from several threads and streams.

Every concurrent result must be bit-identical to the same call made serially: the op is
deterministic, so any difference means shared state or a race.
"""

import random
import threading
from typing import Callable, List

import pytest
import torch

import rope_compat

from cases import Case, make_case
from reference import rope_reference
from tolerances import assert_matches_reference
from vllm_env import vllm_importable

THREADS = 8


def _run_together(workers: List[Callable[[], None]]) -> None:
    """Start every worker at the same moment (a barrier) and re-raise the first failure."""
    barrier = threading.Barrier(len(workers))
    errors: list = []

    def wrap(work):
        try:
            barrier.wait()
            work()
        except BaseException as e:  # reported in the main thread
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


# --- patch_vllm / unpatch_vllm -------------------------------------------------------------------


@pytest.fixture
def vllm_ops():
    if not vllm_importable():
        pytest.skip("needs vLLM")
    import vllm._custom_ops as ops
    if not torch._C._dispatch_has_kernel_for_dispatch_key("_C::rotary_embedding", "CPU"):
        pytest.skip("this vLLM build has no CPU kernel")
    rope_compat.unpatch_vllm()
    yield ops
    rope_compat.unpatch_vllm()


def _vllm_compatible_case() -> Case:
    """A call both vLLM's CPU kernel and rope-compat accept (flat, cache dtype = q dtype)."""
    return make_case(tokens=(7,), heads=4, kv_heads=2, head_size=64, layout="flat")


def _assert_consistent(status: rope_compat.PatchStatus) -> None:
    """A snapshot never shows half a route: both fields of a route are set together."""
    assert bool(status.dispatch_keys) == (status.vllm_schema is not None), status
    if status.functions:
        assert "vllm._custom_ops.rotary_embedding" in status.functions["rotary_embedding"], status


@pytest.mark.vllm
def test_concurrent_patch_unpatch_leaves_a_consistent_state(vllm_ops):
    original = vllm_ops.rotary_embedding
    op = torch.ops._C.rotary_embedding

    def churn(seed: int):
        rng = random.Random(seed)
        for _ in range(15):
            action = rng.choice(("functions", "dispatcher", "unpatch", "status", "call"))
            if action == "functions":
                rope_compat.patch_vllm()
            elif action == "dispatcher":
                rope_compat.patch_vllm(dispatcher=True)
            elif action == "unpatch":
                rope_compat.unpatch_vllm()
            elif action == "status":
                _assert_consistent(rope_compat.patch_status())
            else:
                # Whatever the state, vLLM's names compute the rotation (through either kernel).
                case = _vllm_compatible_case()
                want_q, want_k = rope_reference(*case.args())
                fn = rng.choice((vllm_ops.rotary_embedding, op))
                fn(case.positions, case.query, case.key, case.head_size, case.cos_sin_cache, case.is_neox)
                assert_matches_reference(case.query, want_q)
                assert_matches_reference(case.key, want_k)

    _run_together([lambda s=s: churn(s) for s in range(THREADS)])

    # Whatever order the threads ran in, one unpatch restores everything exactly.
    status = rope_compat.unpatch_vllm()
    assert not status.patched and status.dispatch_keys == () and status.vllm_schema is None
    assert vllm_ops.rotary_embedding is original
    case = make_case(tokens=(3,), inverse=True)
    with pytest.raises(RuntimeError, match="not supported on CPU"):  # vLLM's own kernel again
        op(*case.args())

    # Both routes applied from many threads at once are applied exactly once.
    statuses: list = []
    _run_together([
        lambda: statuses.append(rope_compat.patch_vllm(dispatcher=True)),
        *[lambda: statuses.append(rope_compat.patch_vllm()) for _ in range(THREADS - 1)],
    ])
    final = rope_compat.patch_status()
    assert final.dispatch_keys == ("CPU",) and final.functions == {
        "rotary_embedding": ["vllm._custom_ops.rotary_embedding"]
    }
    for s in statuses:
        _assert_consistent(s)
    case = make_case(tokens=(3,), inverse=True)  # only rope-compat computes the inverse on CPU
    want_q, want_k = rope_reference(*case.args())
    op(*case.args())
    assert_matches_reference(case.query, want_q)
    assert_matches_reference(case.key, want_k)


# --- the op from several threads / streams -------------------------------------------------------


def _cases(device: str) -> List[Case]:
    """Different shapes, layouts and dtypes, one per worker."""
    torch.manual_seed(0)
    layouts = ("flat", "heads", "fused_flat", "fused_heads")
    dtypes = (torch.float32, torch.bfloat16, torch.float16)
    return [
        make_case(
            tokens=(64 + 9 * i,) if i % 2 else (4, 16 + i), heads=4 * (1 + i % 3), kv_heads=2 + 2 * (i % 2),
            head_size=64 if i % 3 else 128, rot_dim=32 if i % 4 == 1 else None, is_neox=i % 2 == 0,
            dtype=dtypes[i % 3], layout=layouts[i % 4], inverse=i == 5, device=device,
        )
        for i in range(THREADS)
    ]


def _fresh(case: Case) -> Case:
    """A copy with its own q and k (the parent fused tensor is copied too)."""
    if case.query._base is not None and case.key is not None and case.key._base is case.query._base:
        parent = case.query._base.clone()  # dense, so the views' strides and offsets carry over
        q = parent.as_strided(case.query.shape, case.query.stride(), case.query.storage_offset())
        k = parent.as_strided(case.key.shape, case.key.stride(), case.key.storage_offset())
    else:
        q = case.query.clone()
        k = None if case.key is None else case.key.clone()
    return Case(case.positions, q, k, case.head_size, case.cos_sin_cache, case.is_neox,
                case.rope_dim_offset, case.inverse)


@pytest.mark.parametrize("entry", ["function", "op"])
def test_threads_match_serial_cpu(entry):
    op = rope_compat.rotary_embedding if entry == "function" else torch.ops.rope_compat.rotary_embedding
    cases = _cases("cpu")
    serial = []
    for c in cases:
        f = _fresh(c)
        op(*f.args())
        serial.append((f.query, f.key))
        want_q, want_k = rope_reference(*c.args())  # c still holds the inputs
        assert_matches_reference(f.query, want_q)
        assert_matches_reference(f.key, want_k)

    repeats = 5
    results: list = [[] for _ in cases]

    def work(i: int):
        for _ in range(repeats):
            f = _fresh(cases[i])
            op(*f.args())
            results[i].append((f.query, f.key))

    _run_together([lambda i=i: work(i) for i in range(len(cases))])
    for (want_q, want_k), got in zip(serial, results):
        assert len(got) == repeats
        for q, k in got:
            assert torch.equal(q, want_q) and torch.equal(k, want_k)


@pytest.mark.gpu
@pytest.mark.parametrize("threaded", [False, True], ids=["one thread", "thread per stream"])
def test_streams_match_serial_cuda(threaded):
    cases = _cases("cuda")
    serial = []
    for c in cases:
        f = _fresh(c)
        rope_compat.rotary_embedding(*f.args())
        serial.append((f.query, f.key))
    torch.cuda.synchronize()

    repeats = 20
    copies = [[_fresh(c) for _ in range(repeats)] for c in cases]  # made before any launch
    streams = [torch.cuda.Stream() for _ in cases]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())  # the copies are ready

    def launch(i: int):
        with torch.cuda.stream(streams[i]):
            for f in copies[i]:
                rope_compat.rotary_embedding(*f.args())

    if threaded:
        _run_together([lambda i=i: launch(i) for i in range(len(cases))])
    else:
        for i in range(len(cases)):
            launch(i)
    torch.cuda.synchronize()
    for (want_q, want_k), fs in zip(serial, copies):
        for f in fs:
            assert torch.equal(f.query, want_q) and torch.equal(f.key, want_k)
