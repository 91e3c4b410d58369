"""The bench summary: geomean and worst speed-up over SDPA's default, rows per kernel family."""

from __future__ import annotations

import math

from autotune.cli.bench import summarize


def row(family: str | None, ours_us: float, sdpa_us: float) -> dict[str, object]:
    return {
        "family": family,
        "median_us": ours_us,
        "sdpa_default_us": sdpa_us,
        "sdpa_flash_us": 2 * sdpa_us,
        "speedup_vs_sdpa_default": sdpa_us / ours_us,
    }


def test_summary_names_the_worst_shape_and_counts_families() -> None:
    data = summarize(
        [
            row("sm90", 10.0, 12.0),
            row("sm90", 10.0, 8.0),
            row("sm80", 10.0, 10.0),
            row(None, 10.0, 10.0),
        ]
    )
    assert math.isclose(data["geomean_vs_sdpa_default"], (1.2 * 0.8) ** 0.25)
    assert data["worst_vs_sdpa_default"] == 0.8
    assert data["rows_per_family"] == {"None": 1, "sm80": 1, "sm90": 2}
    assert math.isclose(data["geomean_vs_sdpa_flash"], 2 * data["geomean_vs_sdpa_default"])


def test_an_empty_bench_has_no_speed_up() -> None:
    data = summarize([])
    assert math.isnan(data["geomean_vs_sdpa_default"])
    assert math.isnan(data["worst_vs_sdpa_default"])
