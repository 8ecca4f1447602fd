"""Reading a user's JSON file, whatever its bytes: every way it can be wrong is one ``UserError``.

What is refused, each with the fix: a missing file, a folder, a file larger than the command
takes (checked before reading, and again while reading, so ``/dev/zero`` ends too), text that is
not UTF-8 (UTF-16 and UTF-32 are named as such; a UTF-8 byte-order mark is accepted), invalid
JSON, ``NaN``/``Infinity`` and numbers beyond a float (``1e400``), integers of more than 4300
digits, and nesting deeper than ``MAX_DEPTH``. A FIFO or a process substitution
(``<(command)``) is read like a file: opening never waits for a writer.
"""

from __future__ import annotations

import codecs
import fcntl
import json
import math
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import UserError, describe_validation_error

if TYPE_CHECKING:  # pydantic loads when a file is read, not for `optpipe --help`
    from pydantic import BaseModel

M = TypeVar("M", bound="BaseModel")

MAX_DEPTH = 32
"""How deep a JSON document may nest (the formats nest at most 6 levels; ``params`` a few)."""
MAX_FILE_BYTES = 512 * 2**20
"""The largest file any command reads (the largest schedule a command takes is smaller)."""

_BOMS = (
    (codecs.BOM_UTF32_LE, "UTF-32"),
    (codecs.BOM_UTF32_BE, "UTF-32"),
    (codecs.BOM_UTF16_LE, "UTF-16"),
    (codecs.BOM_UTF16_BE, "UTF-16"),
)


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def read_bytes(path: Path, what: str, max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The file's bytes, at most ``max_bytes`` of them (more is a ``UserError``)."""
    try:
        # O_NONBLOCK: opening a FIFO without a writer returns at once (then reads end of file)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, expected a {what} JSON file") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise UserError(f"{path}: is a directory, expected a {what} JSON file")
        if stat.S_ISREG(info.st_mode) and info.st_size > max_bytes:
            raise UserError(_too_large(path, what, info.st_size, max_bytes))
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise UserError(_too_large(path, what, None, max_bytes))
    return data


def _too_large(path: Path, what: str, size: int | None, max_bytes: int) -> str:
    has = f"is {_mib(size)}" if size is not None else "goes on past that"
    return (
        f"{path}: {has}; a {what} file this command reads is at most {_mib(max_bytes)} "
        "(is this the right file?)"
    )


def decode(data: bytes, path: Path) -> str:
    """UTF-8 text (a byte-order mark is dropped); anything else is named with the fix."""
    for bom, name in _BOMS:
        if data.startswith(bom):
            raise UserError(f"{path}: is {name} text; save it as UTF-8")
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = data[e.start : e.start + 1].hex()
        raise UserError(
            f"{path}: is not UTF-8 text (byte 0x{bad} at offset {e.start}); save it as UTF-8"
        ) from None
    if "\x00" in text:
        raise UserError(
            f"{path}: holds NUL characters (UTF-16 without a byte-order mark?); save it as UTF-8"
        )
    return text


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number; every number must be finite")


def _finite_float(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise ValueError(f"{text[:20]} is beyond the range of a float; every number must be finite")
    return x


def parse_json(text: str, path: Path) -> Any:
    """The JSON document, with no NaN, infinity or overflowing number, nested at most MAX_DEPTH."""
    try:
        data = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except json.JSONDecodeError as e:
        raise UserError(
            f"{path}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})"
        ) from None
    except RecursionError:
        raise UserError(
            f"{path}: nested too deeply to be a {path.suffix or 'JSON'} file of optpipe "
            f"(at most {MAX_DEPTH} levels)"
        ) from None
    except ValueError as e:  # a constant, an overflowing float, an integer of > 4300 digits
        msg = str(e).split(";")[0] if "digits" in str(e) else str(e)
        raise UserError(f"{path}: not valid JSON here: {msg}") from None
    depth = nesting_depth(data, MAX_DEPTH)
    if depth > MAX_DEPTH:
        raise UserError(f"{path}: nested more than {MAX_DEPTH} levels deep; no optpipe file is")
    return data


def nesting_depth(doc: Any, stop: int) -> int:
    """How deep lists and objects nest in ``doc`` (counting stops past ``stop``), iteratively."""
    deepest = 0
    todo: list[tuple[Any, int]] = [(doc, 0)]
    while todo:
        node, depth = todo.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        depth += 1
        if depth > deepest:
            deepest = depth
            if deepest > stop:
                return deepest
        todo.extend((c, depth) for c in children if isinstance(c, dict | list))
    return deepest


def read_json(path: str | Path, what: str, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """Read, decode and parse a user's JSON file (see the module doc for what is refused)."""
    p = Path(path)
    return parse_json(decode(read_bytes(p, what, max_bytes), p), p)


def load_model(path: str | Path, model: type[M], what: str, max_bytes: int | None = None) -> M:
    """Read and validate a JSON file, raising ``UserError`` with a one-line reason."""
    from pydantic import ValidationError

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
