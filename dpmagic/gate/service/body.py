"""Request bodies parsed defensively: every malformed body is a ``bad_request``.

A body comes from an untrusted kernel, so it may be crafted to make the
parser itself fail in ways the handlers do not expect: numbers with hundreds
of digits (Python refuses ints over 4,300 digits with a ``ValueError``, and a
shorter big int overflows when it becomes a float), ``NaN`` and
``Infinity`` (not JSON, though Python's parser takes them), arrays nested
100,000 deep (``RecursionError``), invalid UTF-8. Each of those becomes an
`InvalidBody`, decided before the engine sees the request, so it charges
nothing and says so, instead of surfacing as an unexpected error whose
fixed text claims a charge.

The limits are far beyond any honest request: a query body is a flat object
of a few fields, with parameters that are scalars or short lists.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from dpmagic.gate.failures import InvalidBody

# Containers inside containers: a query body needs 3 (body → params → a list).
MAX_DEPTH = 32
# Characters of one number literal: 64-bit ints have at most 20 digits, and a
# double needs at most 17 significant ones; beyond this it is not a value we use.
MAX_NUMBER_CHARS = 64


def parse_body(raw: bytes) -> object:
    """The JSON value of ``raw``, or `InvalidBody` saying what is wrong with it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidBody("the request body is not UTF-8") from None
    try:
        value = json.loads(
            text,
            parse_int=_int,
            parse_float=_float,
            parse_constant=_constant,
        )
    except InvalidBody:
        raise
    except RecursionError:
        raise InvalidBody(f"the request body is nested more than {MAX_DEPTH} deep") from None
    except ValueError:
        raise InvalidBody("the request body is not valid JSON") from None
    _check_depth(value)
    return value


def _int(text: str) -> int:
    _check_length(text)
    return int(text)


def _float(text: str) -> float:
    _check_length(text)
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise InvalidBody(f"the number {text[:20]}… is too large")
    return value


def _constant(text: str) -> float:
    raise InvalidBody(f"{text} is not a JSON number")


def _check_length(text: str) -> None:
    if len(text) > MAX_NUMBER_CHARS:
        raise InvalidBody(
            f"a number in the request body has more than {MAX_NUMBER_CHARS} characters"
        )


def _check_depth(value: object) -> None:
    """Refuse containers nested deeper than `MAX_DEPTH`; iterative, so depth cannot
    exhaust the stack here, and linear in the number of values."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children: Iterable[object]
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth >= MAX_DEPTH:
            raise InvalidBody(f"the request body is nested more than {MAX_DEPTH} deep")
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
