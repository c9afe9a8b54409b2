"""The stream job: Kafka alerts -> every filter in one pass -> per-broker topics, and a Delta night archive.

The job itself is :mod:`skyfilter.jobs.filter_stream` (``--help`` explains every option); this script is what
``spark-submit`` and ``python`` run.
"""

import sys

from skyfilter.jobs.filter_stream import main

if __name__ == "__main__":
    sys.exit(main())
