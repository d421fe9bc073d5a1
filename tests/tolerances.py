"""The suite's tolerances: the package's one table (rope_compat/tolerances.py)."""

from rope_compat.tolerances import TOLERANCES, assert_matches_reference  # noqa: F401
