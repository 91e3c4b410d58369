"""`python -m autotune.cli`: the same as the `cute-autotune` command."""

from .main import main

raise SystemExit(main())
