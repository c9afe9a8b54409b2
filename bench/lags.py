"""Lag timelines of a benchmark run: alerts sent but not yet taken in by a lane, and how fast that grows."""

from __future__ import annotations


def lag_timeline(sent: list[tuple[float, int]], done: list[tuple[float, int]], origin: float) -> list[dict]:
    """Alerts sent minus alerts done, at every event: ``sent`` and ``done`` are (time, alerts) pairs;
    times in the points are seconds from ``origin``."""
    events = [(moment, alerts, 0) for moment, alerts in sent] + [(moment, 0, alerts) for moment, alerts in done]
    total_sent = total_done = 0
    points = []
    for moment, more, finished in sorted(events):
        total_sent += more
        total_done += finished
        points.append({"t": round(moment - origin, 2), "lag": max(total_sent - total_done, 0)})
    return points


def lag_growth(timeline: list[dict], sending_s: float) -> float:
    """How fast a lag grows (alerts/s): least-squares slope over the second half of the sending window.

    A lane that keeps up has a flat lag (a slope near 0) whatever its batch
    cycle; one that falls behind grows it by (offered - sustained) alerts/s.
    """
    points = [(p["t"], p["lag"]) for p in timeline if sending_s / 2 <= p["t"] <= sending_s]
    if len(points) < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / len(points)
    mean_lag = sum(lag for _, lag in points) / len(points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    return sum((t - mean_t) * (lag - mean_lag) for t, lag in points) / spread if spread else 0.0


def lane_batches(spark, metrics_path, lanes: tuple[str, ...], since: float = 0.0) -> list[tuple[float, int]]:
    """(end time, alerts) of every batch with alerts of the given lanes that ended after ``since`` (epoch
    seconds), from a stream's metrics table."""
    rows = spark.read.format("delta").load(str(metrics_path)).where("input_alerts > 0") \
        .select("lane", "finished_at", "input_alerts").collect()
    return [(r.finished_at.timestamp(), r.input_alerts) for r in rows
            if r.lane in lanes and r.finished_at.timestamp() >= since]


def plot_lag(axis, series: list[tuple[str, list[dict]]], title: str, legend_title: str | None = None) -> None:
    """The archive lane's lag of each run on one matplotlib ``axis``: (label, :func:`lag_timeline` points)."""
    for label, points in series:
        axis.plot([p["t"] for p in points], [p["lag"] for p in points], label=label)
    axis.set_xlabel("seconds from the first send")
    axis.set_ylabel("alerts not yet archived")
    axis.legend(title=legend_title, fontsize="small")
    axis.set_title(title)
