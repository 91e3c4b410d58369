"""`python -m autotune`: the same as the `cute-autotune` command."""

from .cli.main import main

raise SystemExit(main())
