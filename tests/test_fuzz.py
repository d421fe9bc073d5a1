"""Property-based fuzzing of the rotary op against the float64 reference (cases: fuzz_cases.py).

Every drawn case mixes layout, strides, head counts, partial rotation, dtypes and positions;
see `fuzz_cases.draw_spec`. ROPE_COMPAT_FUZZ_EXAMPLES raises the number of cases per device
(benchmarks/fuzz_long.py runs many more on a GPU, without shrinking).
"""

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz_cases import draw_spec, run_spec
from tolerances import assert_matches_reference

settings.register_profile(
    "rope_compat_fuzz",
    max_examples=int(os.environ.get("ROPE_COMPAT_FUZZ_EXAMPLES", "300")),
    deadline=None,  # the first CUDA call of a process includes start-up time
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    print_blob=True,
)


class _HypothesisChooser:
    def __init__(self, draw):
        self.draw = draw

    def integer(self, lo, hi):
        return self.draw(st.integers(lo, hi))

    def choice(self, options):
        return self.draw(st.sampled_from(list(options)))


@st.composite
def specs(draw, allow_stray: bool):
    return draw_spec(_HypothesisChooser(draw), allow_stray)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@settings(settings.get_profile("rope_compat_fuzz"))
@given(data=st.data())
def test_fuzz_matches_reference(device, data):
    # On CUDA some tokens also get out-of-range positions, which the kernel leaves untouched
    # (on the CPU they raise IndexError: tests/test_hostile_inputs.py).
    spec = data.draw(specs(allow_stray=device == "cuda"), label="spec")
    out = run_spec(spec, device)
    assert out.changed_outside == 0, f"{out.changed_outside} elements changed outside the rotated dims"
    assert_matches_reference(out.actual.to(spec.dtype), out.expected, msg=repr(spec))
