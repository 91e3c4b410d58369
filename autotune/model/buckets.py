"""Length classes: the runtime decides once per class of sequence lengths, not per length.

A KV cache that grows by a token per step, or requests of every length, would otherwise make a
new dispatch decision (database lookups, a nearest-problem search) at each new length. Lengths
up to `EXACT_UP_TO` are their own class (a few query tokens differ in kind, not in degree);
longer ones fall into geometric classes `PER_OCTAVE` to a doubling (each about 9% wide), so
lengths 1 to 10^5 make about 150 classes. A class is decided for its representative problem:
each length the geometric middle of its class (a multiple of the page for a paged cache), and
the order of Lq and Lk kept (torch's path and the causal mask's alignment depend on it).
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import cache

from .problem import MAX_SIZE, Problem

EXACT_UP_TO = 16
PER_OCTAVE = 8


def length_class(length: int) -> int:
    """The class of a sequence length: the length itself up to EXACT_UP_TO, else an index
    that grows by one every 1/PER_OCTAVE of a doubling (above every exact length)."""
    if length <= EXACT_UP_TO:
        return length
    return EXACT_UP_TO + 1 + math.floor(PER_OCTAVE * math.log2(length / EXACT_UP_TO))


@cache  # a few hundred classes: each is worked out once
def class_bounds(index: int) -> tuple[int, int]:
    """The smallest and largest length of a class."""
    if index <= EXACT_UP_TO:
        return index, index
    lower = _first_length(index)
    return lower, min(MAX_SIZE, _first_length(index + 1) - 1)


def _first_length(index: int) -> int:
    # the smallest length whose class is `index` (found from the float estimate, then checked:
    # length_class is what defines the class)
    guess = math.ceil(EXACT_UP_TO * 2 ** ((index - EXACT_UP_TO - 1) / PER_OCTAVE))
    while guess > EXACT_UP_TO + 1 and length_class(guess - 1) >= index:
        guess -= 1
    while length_class(guess) < index:
        guess += 1
    return guess


def representative_length(length: int, multiple: int = 1) -> int:
    """The length a class is decided for: the geometric middle of `length`'s class, rounded
    to a multiple of `multiple` within the class where one lies in it (else `length`)."""
    lower, upper = class_bounds(length_class(length))
    middle = round(math.sqrt(lower * upper))
    if multiple > 1:
        middle = max(lower, min(upper, middle)) // multiple * multiple
        if middle < lower:
            middle += multiple
        if middle > upper:
            return length
    return middle


def representative(problem: Problem) -> Problem:
    """The problem a decision for `problem`'s length class is made for (its batch, heads,
    head dim, dtype, mask and cache kind unchanged)."""
    seqlen_k = representative_length(problem.seqlen_k, problem.page_size or 1)
    seqlen_q = representative_length(problem.seqlen_q)
    order = _sign(problem.seqlen_q - problem.seqlen_k)
    if _sign(seqlen_q - seqlen_k) != order:
        # one class holds both lengths: keep their order, Lq beside Lk
        seqlen_q = seqlen_k + order
    return replace(problem, seqlen_q=max(1, seqlen_q), seqlen_k=seqlen_k)


def _sign(x: int) -> int:
    return (x > 0) - (x < 0)
