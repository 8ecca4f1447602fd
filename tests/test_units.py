"""One convention for bytes and times on the command line and in the inspector."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from optpipe_lightning.schedule.units import (
    byte_unit,
    format_bandwidth,
    format_bytes,
    format_seconds,
    time_unit,
)


@pytest.mark.parametrize(
    ("x", "text"),
    [
        (5.275e10, "52.75 GB"),
        (8e9, "8.00 GB"),
        (1.5e12, "1.50 TB"),
        (3.2e6, "3.20 MB"),
        (999.0, "999 B"),
        (1000.0, "1.00 kB"),
        (0.0, "0 B"),
        (-2.5e9, "-2.50 GB"),
    ],
)
def test_bytes(x: float, text: str) -> None:
    assert format_bytes(x) == text


@pytest.mark.parametrize(
    ("x", "text"),
    [
        (6.132915, "6.133 s"),
        (0.0061329, "6.133 ms"),
        (28.0, "28.000 s"),
        (2.5e-5, "25.000 µs"),
        (3e-9, "3.000 ns"),
        (0.0, "0 s"),
        (900.0, "15.0 min"),
        (5400.0, "90.0 min"),
        (9000.0, "2.50 h"),
    ],
)
def test_seconds(x: float, text: str) -> None:
    assert format_seconds(x) == text


def test_missing_values() -> None:
    assert format_bytes(None) == "-" and format_bytes(None, none="∞") == "∞"
    assert format_seconds(float("nan")) == "-"
    assert format_bandwidth(2.0e10) == "20.0 GB/s"
    assert format_bandwidth(None, none="not measured") == "not measured"


def test_axis_units() -> None:
    assert byte_unit(5e10).name == "GB" and byte_unit(5e10).of(5e10) == 50
    assert byte_unit(12.0).name == "B"
    assert time_unit(28.0).name == "s" and time_unit(0.436).name == "ms"
    assert time_unit(0.0).name == "ns"


@given(st.floats(min_value=-1e16, max_value=1e16, allow_nan=False))
def test_never_scientific(x: float) -> None:
    for text in (format_bytes(x), format_seconds(x), format_bandwidth(abs(x))):
        number = text.split()[0]
        assert "e" not in number.lower(), text
        assert math.isfinite(float(number))
