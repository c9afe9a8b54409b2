"""Rewind an archived night: re-stream it into Kafka, or re-filter it in batch.

The job itself is :mod:`skyfilter.jobs.replay_night` (``--help`` explains every option); this script is what
``spark-submit`` and ``python`` run.
"""

import sys

from skyfilter.jobs.replay_night import main

if __name__ == "__main__":
    sys.exit(main())
