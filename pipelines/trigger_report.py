"""Latency and throughput per delivery trigger, from the streams' own Delta tables.

The job itself is :mod:`skyfilter.jobs.trigger_report` (``--help`` explains every option); this script is what
``spark-submit`` and ``python`` run.
"""

import sys

from skyfilter.jobs.trigger_report import main

if __name__ == "__main__":
    sys.exit(main())
