"""How precise is a cos/sin cache at long context? bf16, fp16 and fp32 caches against float64.

Caches from rope-compat's builder (`compute_cos_sin_cache`: angles in float64, then rounded
to the cache dtype), for positions up to 1,000,000, rotary_dim 128 and Llama 3's
rope_theta 500000. One more column computes the angles in float32 arithmetic, as vLLM's
`RotaryEmbedding` builds its cache (then cast to the model dtype) and as FlashInfer's
computed-cos/sin kernels do on every call. Three measurements per range of positions:

- entry: max |cache entry - exact cos/sin|, what the op reads;
- rotated q: max |rotated query - exact|, a float32 query rotated by rope-compat's op
  with that cache (query entries drawn from N(0, 1));
- shift: the worst position error, in tokens, that the cache's angle error amounts to
  (angle error / frequency). Low frequencies carry the long-range position, and there a small
  angle error is a large shift.

Run: python precision_long_context.py (about 10 s and 1 GB of memory on a CPU).
"""

import math

import torch

import rope_compat

ROT, THETA = 128, 500000.0
RANGES = ((0, 4096), (4096, 32768), (32768, 131072), (131072, 524288), (524288, 1_000_000))
SAMPLES = 2000  # positions per range, the range's last position included
COLUMNS = ("bf16 cache", "fp16 cache", "fp32 cache", "fp32 math")
# Rounding to nearest is off by at most half an ulp of values in [0.5, 1). Torch converts
# float64 to bf16/fp16 through float32, which can add float32's half ulp.
BOUND = {"bf16 cache": 2.0**-9 + 2.0**-25, "fp16 cache": 2.0**-12 + 2.0**-25, "fp32 cache": 2.0**-25}

torch.manual_seed(0)
freqs64 = THETA ** (-torch.arange(0, ROT, 2, dtype=torch.float64) / ROT)
positions = torch.cat([
    torch.cat([torch.randint(lo, hi, (SAMPLES - 1,)), torch.tensor([hi - 1])]) for lo, hi in RANGES
])
exact_angles = positions.double()[:, None] * freqs64  # [positions, ROT / 2]
query = torch.randn(positions.numel(), ROT)


def rotate64(x: torch.Tensor) -> torch.Tensor:
    """NeoX rotation of one head by the exact angles, in float64."""
    a, b = x.double().chunk(2, dim=-1)
    cos, sin = exact_angles.cos(), exact_angles.sin()
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def rows_and_rotation(column: str):
    """(cache rows at `positions` as float64, the query rotated by the op with that cache)."""
    if column == "fp32 math":
        # vLLM's recipe: frequencies, positions and their products in float32.
        inv_freq = 1.0 / (THETA ** (torch.arange(0, ROT, 2, dtype=torch.float32) / ROT))
        angles = positions.float()[:, None] * inv_freq
        table = torch.cat([angles.cos(), angles.sin()], dim=-1)
        rows, pos = table, torch.arange(positions.numel())
    else:
        dtype = {"bf16 cache": torch.bfloat16, "fp16 cache": torch.float16, "fp32 cache": torch.float32}[column]
        table = rope_compat.compute_cos_sin_cache(ROT, RANGES[-1][1], {"rope_theta": THETA}, dtype=dtype)
        rows, pos = table[positions], positions
    q = query.clone()
    rope_compat.rotary_embedding(pos, q, None, ROT, table, True)
    return rows.double(), q


def per_range(values: torch.Tensor):
    """Max of a per-position error over each range of positions."""
    return [v.max().item() for v in values.split(SAMPLES)]


entry, rotated, shift = {}, {}, {}
want = rotate64(query)
for column in COLUMNS:
    rows, q = rows_and_rotation(column)
    cos, sin = rows.chunk(2, dim=-1)
    entry[column] = per_range((rows - torch.cat([exact_angles.cos(), exact_angles.sin()], -1)).abs().amax(-1))
    rotated[column] = per_range((q.double() - want).abs().amax(-1))
    angle_err = torch.remainder(torch.atan2(sin, cos) - exact_angles + math.pi, 2 * math.pi) - math.pi
    shift[column] = per_range((angle_err.abs() / freqs64).amax(-1))


def table(title: str, values: dict, fmt: str) -> str:
    lines = [f"{title}", "", "| positions | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for i, (lo, hi) in enumerate(RANGES):
        cells = [format(values[c][i], fmt) for c in COLUMNS]
        lines.append(f"| {lo:,} - {hi - 1:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


print(f"rotary_dim {ROT}, rope_theta {THETA:g}, {SAMPLES} positions per range, errors against float64")
print(f"lowest frequency {freqs64[-1].item():.3g} rad/token, highest {freqs64[0].item():g}\n")
print(table("max |cos/sin entry - exact|", entry, ".2e") + "\n")
print(table("max |rotated query - exact| (float32 query, entries ~ N(0, 1))", rotated, ".2e") + "\n")
print(table("worst position shift, tokens (angle error / frequency)", shift, ".3g"))

# The claims the migration guide makes from this table.
for column, bound in BOUND.items():  # rounded from float64: bounded at every position
    assert max(entry[column]) <= bound + 1e-12, (column, entry[column])
assert entry["fp32 math"][-1] > 1000 * entry["fp32 cache"][-1], "float32 angles lose precision with position"
assert entry["fp32 math"][-1] > 100 * entry["fp32 math"][0], "and the loss grows with position"
for i in range(len(RANGES)):
    assert rotated["fp32 cache"][i] < rotated["fp16 cache"][i] < rotated["bf16 cache"][i]
    assert shift["fp32 cache"][i] < 0.1 < shift["bf16 cache"][i]
print("\nchecked: caches built in float64 stay within half an ulp at every position; float32 angles "
      "drift with position; fp32 < fp16 < bf16 everywhere: OK")
