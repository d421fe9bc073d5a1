"""The tolerance table: how close a result in its dtype must be to a float64 reference.

One table for the test suite, `rope-compat verify` and the migration guide's examples.
The op computes in float32 and rounds once to the tensor dtype, so its error is about half an
ulp of the output dtype: rtol is one ulp (2**-23, 2**-10, 2**-7 rounded up), atol covers
outputs near zero.
"""

from __future__ import annotations

import torch

TOLERANCES = {
    torch.float32: dict(rtol=2e-6, atol=1e-5),
    torch.float16: dict(rtol=1e-3, atol=1e-3),
    torch.bfloat16: dict(rtol=8e-3, atol=8e-3),
}


def rtol_atol(dtype: torch.dtype) -> tuple:
    """(rtol, atol) of `dtype`."""
    tol = TOLERANCES[dtype]
    return tol["rtol"], tol["atol"]


def assert_matches_reference(actual: torch.Tensor, expected: torch.Tensor, msg: str = "") -> None:
    """Compare a result in its own dtype with the float64 reference (AssertionError if off)."""
    torch.testing.assert_close(
        actual.double().cpu(), expected.double().cpu(), **TOLERANCES[actual.dtype],
        msg=lambda m: f"{msg}\n{m}",
    )
