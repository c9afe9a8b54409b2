"""The decorator filter authors use: ``@alert_filter(columns=[...])``.

Example (``filters/bright_blue.py``)::

    from skyfilter import alert_filter

    @alert_filter(columns=["diaSource.band", "diaSource.psfFlux"])
    def bright_blue(band, flux):
        return (band == "g") & (flux > 50_000)

The function receives one pandas Series per column, in the order given
(a record column arrives as a DataFrame), for a whole batch of alerts at
once, and returns a boolean Series of the same length: True keeps the alert.
"""

from __future__ import annotations

from collections.abc import Callable

FILTER_MARK = "__skyfilter_columns__"


def alert_filter(columns: list[str]) -> Callable[[Callable], Callable]:
    """Mark a function as a skyfilter filter over the given alert columns.

    Args:
        columns: alert fields the function needs, nested fields with dots
            (``"diaSource.snr"``); only these are sent to Python.
    """
    if isinstance(columns, str) or not columns or not all(isinstance(c, str) and c for c in columns):
        raise TypeError("alert_filter(columns=[...]) needs a non-empty list of column names")

    def mark(function: Callable) -> Callable:
        setattr(function, FILTER_MARK, list(columns))
        return function

    return mark
