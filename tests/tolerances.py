"""Tolerances by tensor dtype, in one place, for comparisons against the float64 reference.

The op computes in float32 and rounds once to the tensor dtype, so the error is about half
an ulp of the output dtype; rtol is one ulp (2**-23, 2**-10, 2**-7), atol covers outputs
near zero.
"""

import torch

TOLERANCES = {
    torch.float32: dict(rtol=2e-6, atol=1e-5),
    torch.float16: dict(rtol=1e-3, atol=1e-3),
    torch.bfloat16: dict(rtol=8e-3, atol=8e-3),
}


def assert_matches_reference(actual: torch.Tensor, expected: torch.Tensor, msg: str = "") -> None:
    """Compare a result in its own dtype with the float64 reference."""
    tol = TOLERANCES[actual.dtype]
    torch.testing.assert_close(
        actual.double().cpu(), expected.double().cpu(), **tol, msg=lambda m: f"{msg}\n{m}"
    )
