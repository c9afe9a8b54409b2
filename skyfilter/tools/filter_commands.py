"""``skyfilter filters check|test|status``: what the command line runs for filter authors and operators.

Spark is imported only by the commands that need it, so ``filters status`` answers at once.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError


def run(cfg: Config, args: argparse.Namespace) -> int:
    """``skyfilter filters check|test|status``: the exit code (1 when a filter has a problem)."""
    if args.action == "status":
        return filters_status(cfg, args)
    if args.action == "test":
        return filters_test(cfg, args)
    return filters_check(cfg, args)


def filters_check(cfg: Config, args: argparse.Namespace) -> int:
    """Check a folder of filters against a schema with the stream's own checks; one line per problem."""
    from skyfilter.tools.filter_tools import check_filters, cost_notes, schema_for_check

    if args.target and args.filters_dir and Path(args.target) != Path(args.filters_dir):
        raise SkyfilterError(f"filters check got two folders: {args.target} and --filters-dir {args.filters_dir}; "
                             f"give one")
    chosen = args.target or args.filters_dir
    folder = Path(chosen) if chosen else cfg.path("stream.filters_dir")
    described, schema = schema_for_check(cfg, args.topic, args.schema)
    valid, problems = check_filters(cfg, folder, schema)
    if not valid and not problems:
        raise SkyfilterError(f"no filters in {folder}: a filter is a *.sql or *.py file there")
    for line in [*problems, *cost_notes(cfg, valid, schema)]:
        print(line)
    print(f"{len(valid)} filter(s) OK, {len(problems)} problem(s) in {folder} against {described}")
    return 1 if problems else 0


def filters_status(cfg: Config, args: argparse.Namespace) -> int:
    """Print each filter's state as the stream last recorded it."""
    from skyfilter.local.status import filter_state_counts

    name = args.name or cfg.topics.alerts
    path = cfg.filter_states_file(name)
    if not path.exists():
        raise SkyfilterError(f"no filter states for stream '{name}' ({path}): has filter_stream.py run?")
    states = json.loads(path.read_text())["filters"]
    width = max(len(s["name"]) for s in states) if states else 4
    for state in states:
        reason = f"  {state['reason']}" if state["reason"] else ""
        print(f"{state['name']:<{width}}  {state['kind']:<6}  {state['state']:<11}{reason}")
    print(f"{filter_state_counts(states)} (stream '{name}')")
    return 0


def filters_test(cfg: Config, args: argparse.Namespace) -> int:
    """Run one filter over sample files or an archived night and print what it did."""
    if not args.target:
        raise SkyfilterError("filters test needs the filter's name, e.g. skyfilter filters test bright_transient")
    if bool(args.sample) == bool(args.night):
        raise SkyfilterError("filters test needs exactly one of --sample PATH... or --night YYYY-MM-DD")
    from skyfilter.spark.session import get_spark
    from skyfilter.tools.filter_trial import find_filter, night_frame, run_trial, sample_frame

    folder = Path(args.filters_dir) if args.filters_dir else cfg.path("stream.filters_dir")
    spec = find_filter(folder, args.target)
    spark = get_spark("skyfilter-filters-test")
    if args.sample:
        alerts, source = sample_frame(spark, cfg, args.sample)
    else:
        alerts, source = night_frame(spark, cfg, args.name or cfg.topics.alerts, args.night)
    report = run_trial(spark, spec, alerts, source, args.limit, args.show, cfg)
    for line in report.lines():
        print(line)
    return 1 if report.error else 0
