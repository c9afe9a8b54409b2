"""``skyfilter watchlist`` and ``skyfilter watchmap``: add, list, show and remove the lists and maps filters
use."""

from __future__ import annotations

import argparse

from skyfilter.local.arguments import add_config_arguments
from skyfilter.tools.watch_tools import ABOUT, DEFAULT_LEVEL, DEFAULT_RADIUS_ARCSEC


def register(commands: argparse._SubParsersAction) -> None:
    """Add ``skyfilter watchlist`` and ``skyfilter watchmap`` to the command's parser."""
    for kind, (summary, details) in ABOUT.items():
        parser = commands.add_parser(kind, help=summary, description=f"{kind}s: {summary}.  {details}  Each add "
                                     f"or remove is a new version of a Delta table under <state_dir>/watch; a "
                                     f"running stream reads the new version from its next batch.")
        actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        add = actions.add_parser("add", help=f"add a {kind}, or replace it with a new version",
                                 description=f"Read FILE, check every row, and store it as {kind} NAME's next "
                                             f"version.  A bad file changes nothing.")
        add.add_argument("name", metavar="NAME", help="letters, digits and '_' (filters write "
                                                      f"{kind}s.NAME)")
        add.add_argument("file", metavar="FILE", help="the file to read")
        if kind == "watchlist":
            add.add_argument("--radius", type=float, default=DEFAULT_RADIUS_ARCSEC,
                             help=f"arcsec, for sources without a radius column value (default "
                                  f"{DEFAULT_RADIUS_ARCSEC:g}; at most 3600)")
        else:
            add.add_argument("--level", type=float, default=DEFAULT_LEVEL,
                             help=f"a skymap's credible level kept (default {DEFAULT_LEVEL:g}: the 90%% region)")
        listing = actions.add_parser("list", help=f"every {kind}: version, size, file, when added",
                                     description=f"Every {kind} that exists now, at its newest version.")
        show = actions.add_parser("show", help=f"one {kind}: its versions and its first rows",
                                  description=f"A {kind}'s versions (newest last) and the first rows of one.")
        show.add_argument("name", metavar="NAME")
        show.add_argument("--version", type=int, help="the version to show (default: the newest)")
        show.add_argument("--limit", type=int, default=10, help="rows shown (default 10)")
        drop = actions.add_parser("remove", help=f"remove a {kind} (its versions stay, for replays)",
                                  description=f"Remove a {kind}: filters can no longer name it (a running stream "
                                              f"disables those that do); its versions stay for replaying nights.")
        drop.add_argument("name", metavar="NAME")
        for sub in (add, listing, show, drop):
            add_config_arguments(sub, "where the watch tables live (<state_dir>/watch)")
        parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run one ``watchlist``/``watchmap`` action; errors raise :class:`SkyfilterError`."""
    from skyfilter.tools.watch_tools import run as run_action

    return run_action(args)
