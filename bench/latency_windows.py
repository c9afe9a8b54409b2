"""Delivery latency by window of a run: the first 10 s, 10-30 s, then each minute, the minutes holding a
checkpoint boundary apart from the steady ones.

A whole run's p99 is its worst few seconds: a 60 s run's p99 is its first 10 s,
a 7-minute run's the minute of its checkpoint.  Reported by window, a change to
the start-up, to the boundary and to the steady state each shows in its own row.
A window holds the alerts *sent* in it (seconds from the first alert sent); a
minute is a boundary minute when a Real-time checkpoint was committed in it
(the commit files of the query's checkpoint, :func:`checkpoint_commits`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.broker_load import percentile

FIRST_S = 10.0     # the first window: from the first alert sent
EARLY_S = 30.0     # the second ends here; then 30-60 s, then whole minutes
MINUTE_S = 60.0
FIRST, EARLY, STEADY, BOUNDARY = "first 10 s", "10-30 s", "steady", "boundary"


@dataclass(frozen=True)
class Window:
    """Alerts sent from ``start_s`` to ``end_s`` into the run; ``kind``: first, early, steady or boundary."""

    start_s: float
    end_s: float
    kind: str

    @property
    def label(self) -> str:
        return f"{self.start_s:g}-{self.end_s:g} s"


def windows(span_s: float, boundaries_s: list[float]) -> list[Window]:
    """The windows of a run that sent for ``span_s`` seconds, with checkpoint commits at ``boundaries_s``
    (seconds into the run)."""
    found = [Window(0.0, min(FIRST_S, span_s), FIRST)]
    if span_s > FIRST_S:
        found.append(Window(FIRST_S, min(EARLY_S, span_s), EARLY))
    start = EARLY_S
    while start < span_s:
        end = min(MINUTE_S if start < MINUTE_S else start + MINUTE_S, span_s)
        kind = BOUNDARY if any(start <= b < end for b in boundaries_s) else STEADY
        found.append(Window(start, end, kind))
        start = end
    return found


def _figures(latencies_ms: list[float]) -> dict:
    ordered = sorted(latencies_ms)
    return {"n": len(ordered), "p50_ms": percentile(ordered, 0.5), "p99_ms": percentile(ordered, 0.99),
            "max_ms": ordered[-1] if ordered else None}


def window_rows(variant: str, timeline: list[tuple[float, float]], span_s: float,
                boundaries_s: list[float]) -> list[dict]:
    """One row per window of one run, then one per kind of window from 30 s on (steady minutes together,
    boundary minutes together, with the worst minute's p99).

    ``timeline``: (alert sent, s into the run; its latency, ms) of every message delivered; those sent after
    ``span_s`` (a producer a little late) count in the last window.
    """
    rows, by_kind = [], {STEADY: [], BOUNDARY: []}
    found = windows(span_s, boundaries_s)
    for window in found:
        end = float("inf") if window is found[-1] else window.end_s  # the last holds the stragglers too
        inside = [ms for sent, ms in timeline if window.start_s <= sent < end]
        row = {"variant": variant, "window": window.label, "kind": window.kind, **_figures(inside)}
        rows.append(row)
        if window.kind in by_kind:
            by_kind[window.kind].append((inside, row["p99_ms"]))
    for kind, parts in by_kind.items():
        if parts:
            worst = max((p99 for _, p99 in parts if p99 is not None), default=None)
            rows.append({"variant": variant, "window": f"{kind} minutes ({len(parts)})", "kind": kind,
                         **_figures([ms for inside, _ in parts for ms in inside]), "worst_minute_p99_ms": worst})
    return rows


def checkpoint_commits(checkpoint: Path, since: float) -> list[float]:
    """When each batch of the query checkpointed in ``checkpoint`` was committed, in seconds after ``since``
    (an epoch time), for the commits from ``since`` on."""
    commits = checkpoint / "commits"
    if not commits.is_dir():
        return []
    return sorted(mtime - since for path in commits.iterdir() if path.name.isdigit()
                  and (mtime := path.stat().st_mtime) >= since)


WINDOW_COLUMNS = [("variant", "variant"), ("window", "alerts sent"), ("kind", "kind"), ("n", "messages"),
                  ("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"), ("max_ms", "max ms"),
                  ("worst_minute_p99_ms", "worst minute p99 ms")]
CPU_PARTS = ("driver", "archive", "kafka", "other")


def _cpu_columns(marks: dict[float, dict[str, float]], window: str) -> dict:
    """CPU per part spent over the first window (0-10 s) or the second (10-30 s), from the run's marks."""
    first, early = marks.get(FIRST_S), marks.get(EARLY_S)
    if window == FIRST and first:
        return {f"cpu_{part}_s": first[part] for part in CPU_PARTS}
    if window == EARLY and first and early:
        return {f"cpu_{part}_s": round(early[part] - first[part], 1) for part in CPU_PARTS}
    return {}


def lane_ratio_notes(rows: list[dict], alone_variants: set[str]) -> list[str]:
    """Each kind of window's p99 of every run with both lanes against the mean of the runs of delivery alone."""
    notes = []
    summary = [r for r in rows if r["window"].endswith(")") or r["kind"] in (FIRST, EARLY)]
    for kind in (FIRST, EARLY, STEADY, BOUNDARY):
        alone = [r["p99_ms"] for r in summary if r["kind"] == kind and r["variant"] in alone_variants
                 and r["p99_ms"]]
        if not alone:
            continue
        base = sum(alone) / len(alone)
        for row in summary:
            if row["kind"] == kind and row["variant"] not in alone_variants and row["p99_ms"] is not None:
                notes.append(f"{row['variant']} against delivery alone, {row['window']}: p99 {row['p99_ms']:,.0f} "
                             f"against {base:,.0f} ms ({row['p99_ms'] / base:.2f}x)")
    return notes


def write_windows(args, runs: list[dict], memory, alone_setting: str) -> dict[str, Path]:
    """Write ``user_path_windows.*``: every run's latency by window, CPU per part over its first windows, and
    both lanes against delivery alone (the runs whose settings hold ``alone_setting``)."""
    from bench.harness import runs_table, settings_of
    from bench.report import write_results

    rows = []
    for run in runs:
        for row in window_rows(run["variant"], run["timeline"], args.seconds, run["boundaries_s"]):
            rows.append(row | _cpu_columns(run["cpu_marks"], row["kind"] if "(" not in row["window"] else ""))
    alone = {run["variant"] for run in runs if alone_setting in run["settings"]}
    columns = [*WINDOW_COLUMNS, *[(f"cpu_{part}_s", f"CPU s: {part}") for part in CPU_PARTS]]
    notes = ["Windows by the time each alert was sent, from the first one; a boundary minute holds a commit of the "
             "Real-time query's checkpoint (its commit files' times): "
             + "; ".join(f"{run['variant']} at {', '.join(f'{b:.0f}' for b in run['boundaries_s']) or 'none'} s"
                         for run in runs) + ".",
             "CPU per part over the first 10 s and over 10-30 s of sending ('other': producers and the rest); "
             "the whole run's is in user_path.md.", *lane_ratio_notes(rows, alone)]
    return write_results(args.results, "user_path_windows", "Started as users start it: latency by window",
                         rows, columns, notes, settings_of(args), args.command, _plot(rows), memory.peaks(),
                         runs_table(args), memory.peak_breakdown())


def _plot(rows: list[dict]):
    from bench.report import pyplot

    plt = pyplot()
    figure, axis = plt.subplots(figsize=(9, 4))
    for variant in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == variant and "(" not in r["window"] and r["p99_ms"] is not None]
        axis.plot([r["window"] for r in mine], [r["p99_ms"] for r in mine], marker="o", label=f"{variant} p99")
        axis.plot([r["window"] for r in mine], [r["max_ms"] for r in mine], linestyle=":", label=f"{variant} max")
    for index, row in enumerate(r for r in rows if r["variant"] == rows[0]["variant"] and "(" not in r["window"]):
        if row["kind"] == BOUNDARY:
            axis.axvspan(index - 0.4, index + 0.4, color="gray", alpha=0.15)
    axis.set_yscale("log")
    axis.set_xlabel("alerts sent (s from the first alert; shaded: a checkpoint boundary in that minute)")
    axis.set_ylabel("delivery latency (ms)")
    axis.set_title("Latency by window: the first seconds, the steady minutes, the boundary")
    axis.legend(fontsize="small")
    figure.autofmt_xdate()
    figure.tight_layout()
    return figure
