"""The Overview's search: a case-insensitive substring over every column of a table."""

from __future__ import annotations

import pandas as pd


def search_text(df: pd.DataFrame) -> pd.Series:
    """One lower-case string per row: its values joined, missing values as empty text.

    (``astype(str)`` keeps missing values as floats in pandas 3, which ``str.join`` refuses.)
    """
    if df.empty:
        return pd.Series([], index=df.index, dtype=object)
    text = df.astype(object).where(df.notna(), "").map(str)
    return text.agg(" ".join, axis=1).str.lower()


def matching(df: pd.DataFrame, query: str | None) -> pd.DataFrame:
    """The rows of ``df`` whose text holds ``query`` (all rows when the query is empty)."""
    query = (query or "").strip().lower()
    if not query or df.empty:
        return df
    return df[search_text(df).str.contains(query, regex=False)]
