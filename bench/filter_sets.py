"""Generated filter sets for benchmarks: N threshold filters (SQL or Python twins) spread over B brokers, and a
broker-like mix of both (every format, caps on some brokers)."""

from __future__ import annotations

from pathlib import Path

BANDS = ("u", "g", "r", "i", "z", "y")


CUTS = ("loose", "tight")


def thresholds(index: int, cuts: str = "loose") -> tuple[int, float, str]:
    """Filter ``index``'s cuts: (snr above, reliability above, band excluded); different for every index.

    ``loose``: about 11% of simulated alerts pass a filter (a broker of five filters gets ~20%), the cuts every
    sweep has used; ``tight``: about 1.5% (a broker gets ~6%), closer to what a science filter keeps.
    """
    snr = 5 + index % 40 if cuts == "loose" else 100 + 5 * (index % 40)
    return snr, round(0.3 + 0.006 * (index % 100), 3), BANDS[index % len(BANDS)]


def sql_filter(index: int, cuts: str = "loose") -> str:
    """Filter ``index`` as a SQL file."""
    snr, reliability, band = thresholds(index, cuts)
    return (f"-- generated filter {index}\ndiaSource.snr > {snr}\n"
            f"AND diaSource.reliability > {reliability:.3f}\nAND diaSource.band <> '{band}'\n")


def python_filter(index: int, cuts: str = "loose") -> str:
    """The Python twin of :func:`sql_filter`."""
    snr, reliability, band = thresholds(index, cuts)
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


FORMATS = ("full", "nocutouts", "lite")
LITE_COLUMNS = "diaSource.ra AS ra, diaSource.dec AS dec, diaSource.snr AS snr, diaSource.band AS band"


def write_broker_load(folder: Path, count: int = 100, python: int = 10, max_brokers: int = 20, cap: int = 20,
                      capped_every: int = 4, cuts: str = "tight") -> tuple[Path, Path, dict[str, dict]]:
    """A broker-like filter set: ``count`` filters (:func:`thresholds` of ``cuts``), the last ``python`` of them
    Python, over ``max_brokers`` brokers of every format in turn (``lite`` brokers' SQL filters SELECT a few
    columns), every ``capped_every``-th broker capped at ``cap`` alerts per visit.

    Returns (filters folder, brokers file, per broker: its format, cap and whether it has a Python filter).
    """
    filters = folder / "filters"
    filters.mkdir(parents=True, exist_ok=True)
    for old in filters.iterdir():
        old.unlink()
    python = min(python, count)
    names = [f"f{i:04d}" for i in range(count)]
    brokers: dict[str, dict] = {}
    for b in range(max_brokers):
        subscribed = list(range(b, count, max_brokers)) or [b % count]
        fmt = FORMATS[b % len(FORMATS)]
        brokers[f"bench_{b:02d}"] = {"filters": subscribed, "format": fmt,
                                     "cap": cap if capped_every and b % capped_every == capped_every - 1 else None,
                                     "python": any(i >= count - python for i in subscribed)}
    lite = {i for spec in brokers.values() if spec["format"] == "lite" for i in spec["filters"]}
    for index, name in enumerate(names):
        if index >= count - python:
            (filters / f"{name}.py").write_text(python_filter(index, cuts))
        elif index in lite:
            condition = " ".join(sql_filter(index, cuts).splitlines()[1:])
            (filters / f"{name}.sql").write_text(f"-- generated filter {index}\nSELECT {LITE_COLUMNS}\n"
                                                 f"FROM alerts WHERE {condition}\n")
        else:
            (filters / f"{name}.sql").write_text(sql_filter(index, cuts))
    lines = ["brokers:"]
    for broker, spec in brokers.items():
        lines += [f"  {broker}:", f"    filters: [{', '.join(names[i] for i in spec['filters'])}]",
                  f"    format: {spec['format']}",
                  f"    max_alerts_per_visit: {'null' if spec['cap'] is None else spec['cap']}"]
    brokers_file = folder / "brokers.yaml"
    brokers_file.write_text("\n".join(lines) + "\n")
    return filters, brokers_file, brokers


def add_load_arguments(parser) -> None:
    """The options choosing a benchmark's filter set: the broker-like mix (default) or uniform SQL filters."""
    parser.add_argument("--load", choices=["broker", "uniform"], default="broker",
                        help="broker: the broker-like mix of bench/broker_load.py (SQL and --python-filters Python "
                             "filters, formats full/nocutouts/lite in turn, every --capped-every-th broker capped "
                             "at --cap, 20 if none); uniform: SQL filters only, every broker of --format and --cap "
                             "(default broker)")
    parser.add_argument("--python-filters", type=int, default=10, help="Python filters of the broker mix (default 10)")
    parser.add_argument("--capped-every", type=int, default=4,
                        help="every n-th broker of the broker mix is capped, 0 none (default 4)")
    parser.add_argument("--cuts", choices=CUTS, default="tight",
                        help="the broker mix's cuts: tight (~1.5%% of alerts per filter, ~6%% per broker) or loose "
                             "(~11%% and ~20%%, the uniform sets' cuts) (default tight)")


def load_filter_set(args, folder: Path, fmt: str, cap: int | None) -> tuple[Path, Path]:
    """(filters folder, brokers file) of the filter set ``args`` ask for (see :func:`add_load_arguments`)."""
    if args.load == "uniform":
        return write_filter_set(folder, args.filters, "sql", args.brokers, fmt, cap)
    filters, brokers, _ = write_broker_load(folder, args.filters, args.python_filters, args.brokers, cap or 20,
                                            args.capped_every, args.cuts)
    return filters, brokers


def load_label(args, fmt: str, cap) -> str:
    """How a benchmark's notes name its filter set."""
    if args.load == "uniform":
        return f"{args.filters} SQL filters over {args.brokers} brokers (format {fmt}, cap {cap})"
    python = min(args.python_filters, args.filters)
    capped = len([b for b in range(args.brokers) if args.capped_every and b % args.capped_every
                  == args.capped_every - 1])
    return (f"the broker-like mix: {args.filters} filters ({python} Python, {args.cuts} cuts) over {args.brokers} "
            f"brokers (full, nocutouts and lite in turn; {capped} capped at {cap or 20} per visit)")


def cap_value(text: str) -> int | None:
    """A ``--cap`` option: a number of alerts per visit, or ``none``."""
    return None if str(text).lower() in ("none", "null") else int(text)
