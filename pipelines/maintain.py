"""Archive maintenance: compact finished nights, drop nights past the horizon, vacuum old files.

The job itself is :mod:`skyfilter.jobs.maintain` (``--help`` explains every option); this script is what
``spark-submit`` and ``python`` run.
"""

import sys

from skyfilter.jobs.maintain import main

if __name__ == "__main__":
    sys.exit(main())
