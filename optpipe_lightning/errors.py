"""Turning user mistakes into one line that names the problem and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:  # pydantic and the schedule model load on first use: `optpipe --help` is fast
    from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound="BaseModel")

_TYPE_TAGS = frozenset({"float", "int", "str", "bool", "none", "list", "dict"})


class UserError(Exception):
    """A mistake in what the user gave us; the message is the whole story (exit code 2)."""


def describe_validation_error(err: ValidationError) -> str:
    """The first problem pydantic found, as ``field: reason`` (plus a count of the others)."""
    from .schedule.problem import COST_FIELDS

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


def load_model(path: str | Path, model: type[M], what: str, max_bytes: int | None = None) -> M:
    """Read and validate a JSON file, raising ``UserError`` with a one-line reason."""
    from pydantic import ValidationError

    from .input_files import MAX_FILE_BYTES, read_json

    p = Path(path)
    data = read_json(p, what, MAX_FILE_BYTES if max_bytes is None else max_bytes)
    if not isinstance(data, dict):
        raise UserError(f"{p}: expected a JSON object for a {what}")
    fmt = data.get("format")
    expected = model.model_fields["format"].default if "format" in model.model_fields else None
    if fmt is not None and expected is not None and fmt != expected:
        shown = repr(fmt) if len(repr(fmt)) <= 60 else repr(fmt)[:57] + "..."
        raise UserError(f"{p}: format is {shown}, expected {expected!r} (is this a {what} file?)")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise UserError(f"{p}: {describe_validation_error(e)}") from None
