"""Generated filter sets for benchmarks: N threshold filters (SQL or Python twins) spread over B brokers."""

from __future__ import annotations

from pathlib import Path

BANDS = ("u", "g", "r", "i", "z", "y")


def thresholds(index: int) -> tuple[int, float, str]:
    """Filter ``index``'s cuts: (snr above, reliability above, band excluded); different for every index."""
    return 5 + index % 40, round(0.3 + 0.006 * (index % 100), 3), BANDS[index % len(BANDS)]


def sql_filter(index: int) -> str:
    """Filter ``index`` as a SQL file."""
    snr, reliability, band = thresholds(index)
    return (f"-- generated filter {index}\ndiaSource.snr > {snr}\n"
            f"AND diaSource.reliability > {reliability:.3f}\nAND diaSource.band <> '{band}'\n")


def python_filter(index: int) -> str:
    """The Python twin of :func:`sql_filter`."""
    snr, reliability, band = thresholds(index)
    return ("from skyfilter import alert_filter\n\n\n"
            "@alert_filter(columns=['diaSource.snr', 'diaSource.reliability', 'diaSource.band'])\n"
            f"def f{index:04d}(snr, reliability, band):\n"
            f"    return (snr > {snr}) & (reliability > {reliability:.3f}) & (band != '{band}')\n")


def matches(index: int, alert: dict) -> bool:
    """Filter ``index`` applied to one decoded alert (the per-filter-process baseline's own evaluation)."""
    snr, reliability, band = thresholds(index)
    source = alert["diaSource"]
    return ((source.get("snr") or 0) > snr and (source.get("reliability") or 0) > reliability
            and source.get("band") != band)


def write_filter_set(folder: Path, count: int, kind: str, max_brokers: int, fmt: str = "full",
                     cap: int | None = 20) -> tuple[Path, Path]:
    """``count`` generated filters for ``max_brokers`` brokers; (filters folder, brokers file).

    Every run has the same brokers, so the output stays comparable and only the
    number of filters changes: filter i goes to broker i mod B; with fewer
    filters than brokers, broker b takes filter b mod count.  Each broker gets
    ``fmt`` and a per-visit cap of ``cap`` alerts (None: every match; Real-time
    Mode serves only uncapped brokers).
    """
    filters = folder / "filters"
    filters.mkdir(parents=True, exist_ok=True)
    for old in filters.iterdir():
        old.unlink()
    names = [f"f{i:04d}" for i in range(count)]
    for index, name in enumerate(names):
        text = sql_filter(index) if kind == "sql" else python_filter(index)
        (filters / f"{name}.{'sql' if kind == 'sql' else 'py'}").write_text(text)
    lines = [f"max_alerts_per_visit: {'null' if cap is None else cap}", "brokers:"]
    for b in range(max_brokers):
        subscribed = names[b::max_brokers] or [names[b % count]]
        lines += [f"  bench_{b:02d}:", f"    filters: [{', '.join(subscribed)}]", f"    format: {fmt}"]
    brokers_file = folder / "brokers.yaml"
    brokers_file.write_text("\n".join(lines) + "\n")
    return filters, brokers_file


def cap_value(text: str) -> int | None:
    """A ``--cap`` option: a number of alerts per visit, or ``none``."""
    return None if str(text).lower() in ("none", "null") else int(text)
