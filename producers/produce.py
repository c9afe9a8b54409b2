"""Produce simulated or real alerts into Kafka at a visit cadence (the same as ``skyfilter produce``).

    python producers/produce.py --visits 3 --alerts-per-visit 500 --interval 39

The producers themselves are :mod:`skyfilter.producers`; ``--help`` explains every option.
"""

import sys

from skyfilter.cli import main

if __name__ == "__main__":
    sys.exit(main(["produce", *sys.argv[1:]]))
