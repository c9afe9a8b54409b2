"""Finding and loading user filters: ``filters/<name>.sql`` and ``filters/<name>.py``.

A filter's name is its file stem.  Loading never raises for a broken filter:
each problem comes back as a :class:`FilterProblem` (file, line, reason) so the
others still run.  Checking filters against an alert schema needs Spark and
lives in ``skyfilter/filtering/filter_eval.py``.
"""

from __future__ import annotations

import hashlib
import re
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path

from skyfilter.core.filter_api import FILTER_MARK

NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class FilterProblem:
    """Why a filter is not enabled, pointing at the file and line to fix."""

    path: Path
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


@dataclass
class FilterSpec:
    """A loaded filter: SQL condition text, or a Python function's source and columns."""

    name: str
    path: Path
    kind: str  # "sql" or "python"
    source: str
    columns: list[str] = field(default_factory=list)
    function_name: str = ""
    line: int = 1
    condition: str = ""  # SQL: the WHERE condition, once checked against a schema
    selects: tuple[tuple[str, str], ...] = ()  # SQL full form: (column name, expression) of the lite payload

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]


def load_filters(folder: str | Path) -> tuple[list[FilterSpec], list[FilterProblem]]:
    """Load every ``*.sql`` and ``*.py`` file of a folder (sorted by name)."""
    folder = Path(folder)
    specs, problems = [], []
    if not folder.is_dir():
        return [], [FilterProblem(folder, 0, "filters folder not found")]
    seen: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        if path.suffix not in (".sql", ".py") or path.name.startswith(("_", ".")):
            continue
        name = path.stem
        if not NAME_PATTERN.match(name):
            problems.append(FilterProblem(path, 1, f"filter name '{name}' must be letters, digits and _"))
            continue
        if name in seen:
            problems.append(FilterProblem(path, 1, f"two filters are named '{name}' (also {seen[name].name})"))
            continue
        seen[name] = path
        loaded = load_sql_filter(path) if path.suffix == ".sql" else load_python_filter(path)
        (specs if isinstance(loaded, FilterSpec) else problems).append(loaded)
    return specs, problems


def load_sql_filter(path: Path) -> FilterSpec | FilterProblem:
    """A SQL filter: one boolean condition, or ``SELECT <columns> FROM alerts WHERE <condition>``.

    Its form and validity are settled by Spark's parser and analyzer
    (``skyfilter/filtering/sql_filters.py``); here only an empty file is refused.
    """
    source = path.read_text()
    code = re.sub(r"--[^\n]*|/\*.*?\*/", "", source, flags=re.S)
    if not code.strip():
        return FilterProblem(path, 1, "empty filter: write a boolean condition, e.g. diaSource.snr > 5")
    text = source.rstrip().removesuffix(";").rstrip()
    return FilterSpec(path.stem, path, "sql", text, condition=text)


def load_python_filter(path: Path) -> FilterSpec | FilterProblem:
    """A Python filter: exactly one function decorated with ``@alert_filter``."""
    source = path.read_text()
    try:
        module = compile_module(path, source)
    except SyntaxError as exc:
        return FilterProblem(path, exc.lineno or 1, f"syntax error: {exc.msg}")
    except Exception as exc:  # noqa: BLE001 - any import-time failure disables only this filter
        return FilterProblem(path, _line_in(path, exc), f"import failed: {type(exc).__name__}: {exc}")
    marked = [(name, obj) for name, obj in vars(module).items()
              if callable(obj) and hasattr(obj, FILTER_MARK) and getattr(obj, "__module__", None) == module.__name__]
    if not marked:
        return FilterProblem(path, 1, "no function decorated with @alert_filter(columns=[...])")
    if len(marked) > 1:
        second = marked[1][1]
        return FilterProblem(path, second.__code__.co_firstlineno,
                             f"one filter per file: found {', '.join(n for n, _ in marked)}")
    name, function = marked[0]
    return FilterSpec(path.stem, path, "python", source, columns=getattr(function, FILTER_MARK),
                      function_name=name, line=function.__code__.co_firstlineno)


def compile_module(path: Path, source: str) -> types.ModuleType:
    """Execute a filter file as a fresh module (not added to sys.modules)."""
    module = types.ModuleType(f"skyfilter_user_filter_{path.stem}")
    module.__file__ = str(path)
    exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102 - user filters are code by design
    return module


_FUNCTIONS: dict[tuple[str, str], object] = {}


def filter_function(spec: FilterSpec):
    """The callable of a Python filter, compiled once per process (Spark workers included)."""
    key = (str(spec.path), spec.digest)
    if key not in _FUNCTIONS:
        _FUNCTIONS[key] = getattr(compile_module(spec.path, spec.source), spec.function_name)
    return _FUNCTIONS[key]


def _line_in(path: Path, exc: BaseException) -> int:
    """The deepest traceback line that lies in ``path`` (1 when none does)."""
    lines = [frame.lineno for frame in traceback.extract_tb(exc.__traceback__) if frame.filename == str(path)]
    return lines[-1] if lines else 1
