"""A tiny, safe evaluator for the arithmetic expressions declared in search-space files.

Space files state derived quantities and constraints as Python-like expressions
(``block_m % (16 * num_warps) == 0``). They are data, so they are parsed with ``ast`` and only a
whitelist of node types is evaluated: numbers, names bound by the caller, arithmetic,
comparisons, boolean logic, conditional expressions and the functions ``min``/``max``/``abs``.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {"min": min, "max": max, "abs": abs}


class ExpressionError(ValueError):
    """An expression in a space file is malformed or uses something not allowed."""


@lru_cache(maxsize=512)
def _parse(source: str) -> ast.expr:
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        raise ExpressionError(f"cannot parse expression {source!r}: {exc.msg}") from None
    return tree.body


def names_in(source: str) -> set[str]:
    """The free names an expression refers to (function names excluded)."""
    node = _parse(source)
    called = {
        n.func.id
        for n in ast.walk(node)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} - called


def evaluate(source: str, env: Mapping[str, Any]) -> Any:
    """Evaluate ``source`` with the names in ``env``; raise ExpressionError on anything else."""
    return _eval(_parse(source), env, source)


def _eval(node: ast.expr, env: Mapping[str, Any], source: str) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, bool, str)):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise ExpressionError(f"unknown name {node.id!r} in {source!r}")
        return env[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left, env, source), _eval(node.right, env, source)
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
        value = _eval(node.operand, env, source)
        return -value if isinstance(node.op, ast.USub) else not value
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            return all(_eval(v, env, source) for v in node.values)
        return any(_eval(v, env, source) for v in node.values)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env, source)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            if type(op) not in _COMPARE:
                raise ExpressionError(f"comparison {type(op).__name__} not allowed in {source!r}")
            right = _eval(comparator, env, source)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        branch = node.body if _eval(node.test, env, source) else node.orelse
        return _eval(branch, env, source)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCTIONS
        and not node.keywords
    ):
        return _FUNCTIONS[node.func.id](*(_eval(a, env, source) for a in node.args))
    raise ExpressionError(f"{type(node).__name__} is not allowed in {source!r}")
