"""Stage 8, cli: the `cute-autotune` command, its tables, the demo, bench and report. May
import every stage."""
