"""The op inside CUDA graphs and torch.compile, and its host behaviour (no sync, no allocation).

torch.compile is checked with a model-like block: a fused qkv projection, split into q/k/v
views, rotated in place, then attention. On the CPU the compile uses the `aot_eager`
backend: it runs Dynamo (fullgraph: any graph break fails) and AOTAutograd's
functionalization of the in-place op, the steps where a mutation of views can be lost, in
seconds; Inductor's C++ build would take most of a minute. On CUDA Inductor compiles it with
`mode="reduce-overhead"`, i.e. inside CUDA graphs.
"""

from typing import Callable, List

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import rope_compat
from rope_compat.ops import torch_impl

from cases import Case, make_case, random_cache
from reference import rope_reference
from tolerances import assert_matches_reference

# Compiled and eager blocks differ only by how Inductor orders float32 sums (matmul,
# softmax); the rotation itself is the same op in both.
BLOCK_TOLERANCE = dict(rtol=1e-4, atol=1e-5)


class RopeAttention(nn.Module):
    """qkv projection -> q/k/v views -> rotary embedding in place -> causal GQA attention."""

    def __init__(self, hidden: int = 96, heads: int = 4, kv_heads: int = 2, head_size: int = 32,
                 rot_dim: int = 16, is_neox: bool = True, max_position: int = 512):
        super().__init__()
        self.heads, self.kv_heads, self.head_size, self.is_neox = heads, kv_heads, head_size, is_neox
        self.qkv = nn.Linear(hidden, (heads + 2 * kv_heads) * head_size, bias=False)
        self.register_buffer("cos_sin_cache", random_cache(max_position, rot_dim, torch.float32))

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        t, d = x.shape[0], self.head_size
        q, k, v = self.qkv(x).split([self.heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
        rope_compat.rotary_embedding(positions, q, k, d, self.cos_sin_cache, self.is_neox)
        q = q.view(t, self.heads, d).transpose(0, 1)
        k = k.view(t, self.kv_heads, d).transpose(0, 1)
        v = v.reshape(t, self.kv_heads, d).transpose(0, 1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return out.transpose(0, 1).reshape(t, -1)


@pytest.fixture
def fresh_dynamo():
    """Each compile test starts from an empty Dynamo cache (no recompile limits carried over)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _inputs(block: RopeAttention, tokens: int, device: str):
    positions = torch.randint(0, block.cos_sin_cache.shape[0], (tokens,), device=device)
    return positions, torch.randn(tokens, block.qkv.in_features, device=device)


def _block_without_rope_is_different(block, positions, x, out) -> None:
    """Guard against a comparison that cannot fail: the rotation must change the output."""
    cache = block.cos_sin_cache
    block.cos_sin_cache = torch.cat([torch.ones_like(cache[:, ::2]), torch.zeros_like(cache[:, ::2])], -1)
    try:
        assert not torch.allclose(block(positions, x), out)
    finally:
        block.cos_sin_cache = cache


@torch.no_grad()
def test_compile_block_fullgraph_matches_eager_cpu(fresh_dynamo):
    block = RopeAttention().eval()
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    for tokens in (11, 11, 5):  # new values, then a new shape (a recompile)
        positions, x = _inputs(block, tokens, "cpu")
        want = block(positions, x)
        torch.testing.assert_close(compiled(positions, x), want, **BLOCK_TOLERANCE)
    _block_without_rope_is_different(block, positions, x, want)


@torch.no_grad()
def test_block_has_no_graph_break_cpu(fresh_dynamo):
    block = RopeAttention().eval()
    explanation = torch._dynamo.explain(block)(*_inputs(block, 7, "cpu"))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def _rotate_inputs(positions, q, k, cos_sin_cache, head_size: int, is_neox: bool, inverse: bool):
    rope_compat.rotary_embedding(positions, q, k, head_size, cos_sin_cache, is_neox, 0, inverse)


@pytest.mark.parametrize("layout", ["fused_flat", "fused_heads"])
@pytest.mark.parametrize("inverse", [False, True])
@torch.no_grad()
def test_compiled_call_mutates_its_inputs(layout, inverse, device, fresh_dynamo):
    # The compiled function must write its result back into the caller's q and k, which are
    # views of one fused tensor (graph inputs that alias each other's storage).
    backend = "aot_eager" if device == "cpu" else "inductor"
    compiled = torch.compile(_rotate_inputs, fullgraph=True, backend=backend)
    case = make_case(
        tokens=(3, 5), heads=4, kv_heads=2, head_size=64, rot_dim=32, layout=layout, inverse=inverse,
        device=device,
    )
    want_q, want_k = rope_reference(*case.args())
    v_and_padding = case.query._base[..., (4 + 2) * 64 :]  # make_case: 4 q heads, 2 kv heads
    before = v_and_padding.clone()
    compiled(case.positions, case.query, case.key, case.cos_sin_cache, case.head_size, case.is_neox, inverse)
    assert_matches_reference(case.query, want_q)
    assert_matches_reference(case.key, want_k)
    assert torch.equal(v_and_padding, before)


@pytest.mark.gpu
@torch.no_grad()
def test_compile_reduce_overhead_block_matches_eager_cuda(fresh_dynamo):
    block = RopeAttention().cuda().eval()
    compiled = torch.compile(block, mode="reduce-overhead", fullgraph=True)
    for step in range(6):  # the first calls record the CUDA graph, later ones replay it
        positions, x = _inputs(block, 24, "cuda")
        got = compiled(positions, x).clone()  # replays reuse the output memory
        want = block(positions, x)
        torch.testing.assert_close(got, want, **BLOCK_TOLERANCE, msg=lambda m: f"call {step}: {m}")
    _block_without_rope_is_different(block, positions, x, want)


# --- CUDA graphs ---------------------------------------------------------------------------------

ENTRIES: dict = {
    "function": rope_compat.rotary_embedding,
    "op": torch.ops.rope_compat.rotary_embedding,
    "torch_impl": torch_impl.rotary_embedding,  # the Torch fallback, also on CUDA tensors
}


def _graph_cases() -> List[Case]:
    """Several layouts and dtypes rotated inside one captured graph."""
    return [
        make_case(tokens=(33,), heads=8, kv_heads=2, head_size=128, dtype=torch.bfloat16,
                  layout="fused_flat", device="cuda"),
        make_case(tokens=(3, 7), heads=4, kv_heads=4, head_size=64, rot_dim=16, rope_dim_offset=8,
                  is_neox=False, dtype=torch.float16, pos_dtype=torch.int32, layout="fused_heads",
                  device="cuda"),
        make_case(tokens=(5,), heads=6, kv_heads=1, head_size=80, rot_dim=40, inverse=True,
                  cache_dtype=torch.float64, layout="heads", with_key=False, device="cuda"),
    ]


def _refill(case: Case) -> None:
    """New values in the static tensors, in place (what an engine does before a replay)."""
    case.positions.copy_(torch.randint_like(case.positions, 0, case.cos_sin_cache.shape[0]))
    for x in (case.query, case.key):
        if x is not None:
            x.copy_(torch.randn_like(x))
    case.cos_sin_cache.copy_(random_cache(*case.cos_sin_cache.shape, case.cos_sin_cache.dtype, "cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("entry", list(ENTRIES))
def test_cuda_graph_replays_match_reference(entry):
    op: Callable = ENTRIES[entry]
    cases = _graph_cases()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as CUDA graphs require
        for c in cases:
            op(*c.args())
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # capturing fails if the op synchronizes the host
        for c in cases:
            op(*c.args())
    for replay in range(50):
        wants = []
        for c in cases:
            _refill(c)
            wants.append(rope_reference(*c.args()))
        graph.replay()
        torch.cuda.synchronize()
        for i, (c, (want_q, want_k)) in enumerate(zip(cases, wants)):
            assert_matches_reference(c.query, want_q, msg=f"replay {replay}, case {i}")
            if c.key is not None:
                assert_matches_reference(c.key, want_k, msg=f"replay {replay}, case {i}")


@pytest.mark.gpu
@pytest.mark.parametrize("entry", list(ENTRIES))
def test_cuda_call_does_not_sync_the_host(entry):
    case = make_case(tokens=(2, 9), layout="fused_heads", dtype=torch.bfloat16, device="cuda")
    want_q, want_k = rope_reference(*case.args())
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any synchronizing call raises
    try:
        ENTRIES[entry](*case.args())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_matches_reference(case.query, want_q)
    assert_matches_reference(case.key, want_k)


@pytest.mark.gpu
@pytest.mark.parametrize("entry", ["function", "op"])
def test_cuda_kernel_allocates_nothing(entry):
    if rope_compat.backend_for("cuda") != "cuda-kernel":
        pytest.skip("the CUDA kernel is not built (the Torch fallback allocates temporaries)")
    case = make_case(tokens=(64,), layout="fused_flat", dtype=torch.bfloat16, device="cuda")
    ENTRIES[entry](*case.args())  # a first call may set up per-device state
    torch.cuda.synchronize()
    allocated, stats = torch.cuda.memory_allocated(), torch.cuda.memory_stats()
    ENTRIES[entry](*case.args())
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == allocated
    after = torch.cuda.memory_stats()
    assert after["allocation.all.allocated"] == stats["allocation.all.allocated"]
