"""What every benchmark writes: the machine, the versions, the command, and its results as JSON, CSV,
a Markdown table and a PNG plot."""

from __future__ import annotations

import csv
import datetime as dt
import json
import os
import platform
import shlex
import sys
from pathlib import Path

import psutil

from skyfilter.core.versions import versions


def machine() -> dict:
    """Cores, memory and versions of the machine a benchmark ran on."""
    pins = versions()
    return {"cores": os.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "platform": platform.platform(),
            "python": platform.python_version(), "spark": pins["SPARK_VERSION"], "delta": pins["DELTA_VERSION"],
            "kafka": pins["KAFKA_VERSION"]}


def command_line(module: str, argv: list[str] | None) -> str:
    """The command that ran a benchmark module, as it could be typed again."""
    return shlex.join(["python", "-m", module, *(sys.argv[1:] if argv is None else argv)])


def markdown_table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """A Markdown table of ``rows`` with (key, header) columns."""
    lines = ["| " + " | ".join(h for _, h in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [_cell(row.get(key)) for key, _ in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return "" if value is None else str(value)


def write_results(folder: Path, name: str, title: str, rows: list[dict], columns: list[tuple[str, str]],
                  notes: list[str], settings: dict, command: str, figure=None,
                  peak_rss_mb: dict[str, float] | None = None, runs_table: Path | None = None,
                  peak_breakdown: str | None = None) -> dict[str, Path]:
    """Write ``<name>.json``, ``.csv``, ``.md`` (and ``.png`` when a figure is given) into ``folder``.

    ``peak_rss_mb`` is the highest resident memory of each process of the run
    (driver, Kafka, ...) and ``peak_breakdown`` the processes behind the highest
    total (:meth:`skyfilter.local.memory.RssSampler.peak_breakdown`); with ``runs_table`` the run is also
    appended to that ``bench_runs`` Delta table, so runs can be compared over time with SQL.
    """
    folder.mkdir(parents=True, exist_ok=True)
    peaks = {process: round(mb) for process, mb in (peak_rss_mb or {}).items()}
    info = {"benchmark": name, "title": title, "finished_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": machine(), "command": command, "settings": settings, "peak_rss_mb": peaks,
            "peak_breakdown": peak_breakdown, "results": rows, "notes": notes}
    paths = {kind: folder / f"{name}.{kind}" for kind in ("json", "csv", "md")}
    paths["json"].write_text(json.dumps(info, indent=1, default=str))
    with paths["csv"].open("w", newline="") as handle:
        fields = list(dict.fromkeys(key for row in rows for key in row))  # rows may leave some out
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    spec = info["machine"]
    text = [f"## {title}", "", markdown_table(rows, columns), "",
            f"Machine: {spec['cores']} cores, {spec['memory_gib']} GiB, {spec['platform']}; Spark {spec['spark']}, "
            f"Delta {spec['delta']}, Kafka {spec['kafka']}, Python {spec['python']}.", "",
            f"Command: `{info['command']}` ({info['finished_at']})", ""]
    if peaks:
        text[-1:-1] = ["", "Peak memory (RSS): " + ", ".join(f"{process} {mb:,} MB" for process, mb in peaks.items())
                       + f"; {sum(peaks.values()):,} MB together."
                       + (f"\nAt the highest total: {peak_breakdown}." if peak_breakdown else "")]
    text += [f"* {note}" for note in notes]
    if figure is not None:
        paths["png"] = folder / f"{name}.png"
        figure.savefig(paths["png"], dpi=110, bbox_inches="tight")
        text += ["", f"![{title}]({name}.png)"]
    paths["md"].write_text("\n".join(text) + "\n")
    if runs_table is not None:
        record_run(runs_table, info)
    return paths


def record_run(table: Path, info: dict) -> None:
    """Append one benchmark run to the ``bench_runs`` Delta table (JSON columns for the variable parts)."""
    from skyfilter.spark.session import get_spark

    spark = get_spark("skyfilter-bench")
    row = (info["benchmark"], dt.datetime.fromisoformat(info["finished_at"]), info["command"],
           json.dumps(info["machine"]), json.dumps(info["settings"], default=str), info["peak_rss_mb"],
           json.dumps(info["results"], default=str), "\n".join(info["notes"]))
    schema = ("benchmark string, finished_at timestamp, command string, machine string, settings string, "
              "peak_rss_mb map<string,bigint>, results string, notes string")
    spark.createDataFrame([row], schema).write.format("delta").mode("append").save(str(table))


def pyplot():
    """matplotlib.pyplot drawing to files (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def update_docs(page: Path, results: Path) -> list[str]:
    """Refresh the blocks ``<!-- bench:NAME -->...<!-- /bench:NAME -->`` of a docs page from ``results/NAME.md``.

    A block gets the result's table, machine, command and peak-memory lines, and
    ``NAME.png`` is copied beside the page (``img/``), so the documentation quotes
    the measured figures and plots instead of retyping them.  Returns the names
    refreshed.
    """
    import re
    import shutil

    text = page.read_text()
    refreshed = []

    def block(match: re.Match) -> str:
        name = match.group(1)
        source = results / f"{name}.md"
        if not source.exists():
            return match.group(0)
        body = source.read_text().split("\n\n")
        kept = [part for part in body[1:] if part.startswith(("|", "Machine:", "Command:", "Peak memory"))]
        plot = results / f"{name}.png"
        if plot.exists():
            (page.parent / "img").mkdir(exist_ok=True)
            shutil.copy(plot, page.parent / "img" / plot.name)
        refreshed.append(name)
        return f"<!-- bench:{name} -->\n" + "\n\n".join(kept) + f"\n<!-- /bench:{name} -->"

    text = re.sub(r"<!-- bench:(\w+) -->.*?<!-- /bench:\1 -->", block, text, flags=re.S)
    page.write_text(text)
    return refreshed


if __name__ == "__main__":
    ROOT = Path(__file__).resolve().parents[1]
    for page in sorted((ROOT / "docs").glob("*.md")):
        names = update_docs(page, ROOT / "bench" / "results")
        if names:
            print(f"docs/{page.name}: refreshed {len(names)} benchmark table(s): {', '.join(names)}")
