from __future__ import annotations

import pytest

from autotune.model.expressions import ExpressionError, evaluate, names_in


def test_arithmetic_comparisons_and_functions() -> None:
    env = {"a": 7, "b": 2, "flag": True}
    assert evaluate("a // b + a % b * 10", env) == 13
    assert evaluate("max(a, b, 9) if flag else -1", env) == 9
    assert evaluate("1 < b <= 2 and not (a == 3)", env) is True
    assert evaluate("b < 1 or a > 8", env) is False


@pytest.mark.parametrize(
    "source",
    [
        "__import__('os')",
        "a.__class__",
        "[x for x in (1, 2)]",
        "open('f')",
        "a[0]",
        "lambda: 1",
    ],
)
def test_rejects_everything_outside_the_whitelist(source: str) -> None:
    with pytest.raises(ExpressionError):
        evaluate(source, {"a": 1})


def test_unknown_names_and_syntax_errors_are_reported() -> None:
    with pytest.raises(ExpressionError, match="unknown name 'c'"):
        evaluate("c + 1", {})
    with pytest.raises(ExpressionError, match="cannot parse"):
        evaluate("1 +", {})


def test_names_in_ignores_function_names() -> None:
    assert names_in("max(a, b) + min(c, 1)") == {"a", "b", "c"}
