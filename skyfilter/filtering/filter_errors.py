"""Python filter errors of Real-time Mode, heard from the delivery log as they happen.

A Real-time query reports its figures once per checkpoint interval (minutes).
A Python filter that raises, hangs or returns the wrong length must be
quarantined sooner: the query writes one ``filter_error`` record to the
delivery log, in the same Kafka write as its broker messages; the stream's
delivery log follower (``skyfilter/lanes/log_follower.py``) hears them as they
come and :class:`FilterErrorWatch` keeps them for the stream's main loop to
hand to the quarantine (``skyfilter/plan/quarantine.py``).  A watch worker that
cannot start is reported the same way, for each filter reading lists or maps.
"""

from __future__ import annotations

import queue

from pyspark.sql import Column
from pyspark.sql import functions as F

from skyfilter.filtering.filter_eval import PYTHON_COLUMN, REPORT_FIELD, merge_reports

KIND = "filter_error"


def error_record(lane: str, report: Column | None = None) -> Column:
    """The JSON value of a delivery-log ``filter_error`` record: the lane and the failing filters' report
    (by default the Python filters'), null on rows where no filter failed."""
    report = F.col(PYTHON_COLUMN)[REPORT_FIELD] if report is None else report
    return F.when(report.isNotNull(), F.to_json(F.struct(F.lit(KIND).alias("kind"), F.lit(lane).alias("lane"),
                                                         report.alias("report"))))


class FilterErrorWatch:
    """The ``filter_error`` records of the delivery log heard since the last look (fed by the stream's
    :class:`~skyfilter.lanes.log_follower.DeliveryLogFollower`, on its thread)."""

    def __init__(self):
        self.reports: queue.Queue[str] = queue.Queue()

    def heard(self, record: dict, _timestamp_ms: int) -> None:
        """A ``filter_error`` record: keep its report for the main loop."""
        self.reports.put(record["report"])

    def drain(self) -> dict[str, dict]:
        """The errors heard since the last call, merged per filter (see :func:`merge_reports`)."""
        texts = []
        while True:
            try:
                texts.append(self.reports.get_nowait())
            except queue.Empty:
                return merge_reports(texts)
