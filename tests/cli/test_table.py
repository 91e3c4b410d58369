"""CLI tables fit the width they are given: columns that do not fit move under their row, whole."""

from __future__ import annotations

from autotune.cli.table import render_table

NAME = "fwd_sm90_d128_bm128_bn128_wg2_s2_r24_o1_p1_t1_bf16_causal"
HEADERS = ["problem", "family", "best config", "TFLOP/s", "note"]
ROWS = [
    [
        "B4 H16 L2048 D128 fp16",
        "sm90",
        NAME,
        "612.5",
        "a long remark in plain words that has to wrap when it does not fit the width",
    ],
    ["", "sm80", "fwd_sm80_d128", "353.4", ""],
]


def test_a_table_that_fits_is_one_line_per_row() -> None:
    table = render_table(["a", "bb"], [["1", "2"], ["333", "4"]], width=100)
    assert table.splitlines() == ["a    bb", "---  --", "1    2", "333  4"]


def test_a_wide_table_moves_its_widest_columns_under_each_row() -> None:
    lines = render_table(HEADERS, ROWS, width=60).splitlines()
    assert all(len(line) <= 60 for line in lines if NAME not in line)
    assert lines[0].split() == ["problem", "family", "TFLOP/s"]
    assert f"    best config: {NAME}" in lines  # a name is never broken
    assert lines[lines.index(f"    best config: {NAME}") - 1].startswith("B4 H16 L2048")
    assert lines[-1] == "    best config: fwd_sm80_d128"  # an empty moved cell adds no line
    notes = [line for line in lines if line.startswith("    note: ")]
    assert len(notes) == 1 and lines[lines.index(notes[0]) + 1].startswith("      ")


def test_the_caller_says_which_columns_may_move() -> None:
    lines = render_table(HEADERS, ROWS, width=80, movable=["note", "best config"]).splitlines()
    assert lines[0].split() == ["problem", "family", "TFLOP/s"]
    lines = render_table(HEADERS, ROWS, width=200, movable=["note"]).splitlines()
    assert NAME in lines[2] and len(lines) == 4  # wide enough: nothing moves
