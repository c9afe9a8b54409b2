"""A stream's filter files and brokers file, read once per run.

The run plan (which broker Real-time Mode serves), the stream plan (each
filter checked against the alert's columns) and the filter states all start
from the one reading a run makes; hot reload reads the files again only when
they change.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from skyfilter.core.brokers import BrokerSpec, load_brokers
from skyfilter.core.filter_loader import FilterProblem, FilterSpec, load_filters


@dataclass(frozen=True)
class StreamFiles:
    """What the filter files and the brokers file said when they were read."""

    filters_dir: Path
    brokers_file: Path
    filters: tuple[FilterSpec, ...]      # the filter files that load
    problems: tuple[FilterProblem, ...]  # those that do not, with why
    brokers: tuple[BrokerSpec, ...]

    @property
    def python(self) -> set[str]:
        """The names of the Python filters, working or not."""
        return {spec.name for spec in self.filters if spec.kind == "python"} | \
            {problem.path.stem for problem in self.problems if problem.path.suffix == ".py"}

    @property
    def names(self) -> set[str]:
        """Every filter file's name, working or not."""
        return {spec.name for spec in self.filters} | \
            {problem.path.stem for problem in self.problems if problem.path.suffix in (".sql", ".py")}


def read_stream_files(filters_dir: Path, brokers_file: Path,
                      brokers: list[BrokerSpec] | None = None) -> StreamFiles:
    """Read the filters of ``filters_dir`` and the brokers of ``brokers_file`` (``brokers``: already read)."""
    specs, problems = load_filters(filters_dir)
    brokers = load_brokers(brokers_file) if brokers is None else brokers
    return StreamFiles(Path(filters_dir), Path(brokers_file), tuple(specs), tuple(problems), tuple(brokers))
