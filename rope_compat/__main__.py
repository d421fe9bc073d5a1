"""`python -m rope_compat info | verify | bench`."""

from .cli import main

raise SystemExit(main())
