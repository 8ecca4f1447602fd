"""Turning user mistakes into one line that names the problem and the fix."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pydantic and the schedule model load on first use: `optpipe --help` is fast
    from pydantic import ValidationError

_TYPE_TAGS = frozenset({"float", "int", "str", "bool", "none", "list", "dict"})


class UserError(Exception):
    """A mistake in what the user gave us; the message is the whole story (exit code 2)."""


def counted(n: int, noun: str) -> str:
    """``1 problem``, ``2 problems``, ``0 problems`` (nouns that take an s)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def describe_validation_error(err: ValidationError) -> str:
    """The first problem pydantic found, as ``field: reason`` (plus a count of the others)."""
    from ..schedule.problem import COST_FIELDS

    errors = err.errors(include_url=False)
    first = errors[0]
    loc = [str(x) for x in first["loc"]]
    # union members show up as extra loc parts ("float", "list[float]", "function-after[...]");
    # field names never hold brackets or these bare type names
    loc = [x for x in loc if x not in _TYPE_TAGS and "[" not in x and not x.startswith("constr")]
    field = ".".join(loc)
    msg = str(first["msg"]).removeprefix("Value error, ")
    kind = str(first["type"])
    if loc and loc[-1] in {*COST_FIELDS, "bytes"} and kind.endswith("_type"):
        msg = "expected a number, a list of num_stages numbers or a [stage][chunk] list of lists"
    elif kind == "extra_forbidden":
        msg = "unknown field (check the spelling; extra fields are not allowed)"
    elif kind == "missing":
        msg = "required field is missing"
    distinct = {tuple(e["loc"][:1]) for e in errors}
    more = f" (and {len(distinct) - 1} more field(s))" if len(distinct) > 1 else ""
    return f"{field}: {msg}{more}" if field else f"{msg}{more}"
