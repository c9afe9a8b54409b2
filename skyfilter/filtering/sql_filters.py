"""SQL filters read by Spark's own parser and analyzer.

A ``.sql`` filter is either a bare condition (``diaSource.snr > 50``) or one
query ``SELECT <columns> FROM alerts WHERE <condition>``; the selected
columns are that filter's ``lite`` payload.  Anything that is not a per-alert
row condition is refused before the stream starts, with file, line and a
plain reason: several statements, DDL/DML, other tables, joins, subqueries,
aggregates, window functions, ORDER BY/LIMIT/DISTINCT, and non-deterministic
functions (``rand()``, ``now()``...), which would make a replayed night
differ from the original.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pyspark.errors import AnalysisException, ParseException
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from skyfilter.core.filter_loader import FilterProblem, FilterSpec
from skyfilter.spark.internals import (
    SqlTree,
    analyzed_plan_nodes,
    nondeterministic_expressions,
    parse_sql_expression,
    parse_sql_statement,
)

TABLE = "alerts"

# Spark expressions whose value depends on when or where they run, not on the alert.
TIME_OR_PLACE_FUNCTIONS = {
    "Now", "CurrentTimestamp", "CurrentDate", "LocalTimestamp", "CurrentBatchTimestamp", "CurrentTime",
    "Rand", "Randn", "Uniform", "RandStr", "Uuid", "Shuffle", "MonotonicallyIncreasingID", "SparkPartitionID",
    "InputFileName", "InputFileBlockStart", "InputFileBlockLength",
}
SUBQUERY_EXPRESSIONS = {"ScalarSubquery", "ListQuery", "Exists", "InSubquery", "LateralSubquery"}
PLAN_REASONS = {
    "Join": "joins are not allowed: a filter looks at one alert at a time",
    "Aggregate": "aggregates (GROUP BY, count, avg...) are not allowed: a filter looks at one alert at a time",
    "Window": "window functions (OVER ...) are not allowed: a filter looks at one alert at a time",
    "Sort": "ORDER BY is not allowed: a filter keeps or drops each alert on its own",
    "GlobalLimit": "LIMIT is not allowed: per-visit limits are the broker's max_alerts_per_visit",
    "LocalLimit": "LIMIT is not allowed: per-visit limits are the broker's max_alerts_per_visit",
    "Distinct": "DISTINCT is not allowed: a filter keeps or drops each alert on its own",
    "Deduplicate": "DISTINCT is not allowed: a filter keeps or drops each alert on its own",
    "Union": "UNION is not allowed: write one condition with OR",
    "Intersect": "INTERSECT is not allowed: write one condition with AND",
    "Except": "EXCEPT is not allowed: write one condition with AND NOT",
    "Generate": "generators (explode, LATERAL VIEW) are not allowed: a filter emits at most one row per alert",
    "WithCTE": "WITH (common table expressions) is not allowed: write SELECT ... FROM alerts WHERE ...",
    "Expand": "GROUPING SETS/CUBE/ROLLUP are not allowed: a filter looks at one alert at a time",
}
STATEMENT_WORDS = {
    "SELECT", "WITH", "FROM", "VALUES", "TABLE", "MAP", "REDUCE", "INSERT", "DROP", "CREATE", "DELETE", "UPDATE",
    "ALTER", "MERGE", "TRUNCATE", "SET", "RESET", "USE", "SHOW", "DESCRIBE", "DESC", "EXPLAIN", "CACHE", "UNCACHE",
    "REFRESH", "GRANT", "REVOKE", "REPLACE", "LOAD", "ANALYZE", "MSCK", "ADD", "LIST", "DECLARE", "CALL", "EXECUTE",
}


@dataclass(frozen=True)
class SqlShape:
    """A valid SQL filter: its condition and, for the full form, the selected columns."""

    condition: str
    selects: tuple[tuple[str, str], ...] = ()  # (output name, expression text)


def analyze_sql(frame: DataFrame, spec: FilterSpec, paths: list[str]) -> SqlShape | FilterProblem:
    """Parse and analyze one SQL filter against the columns of ``frame`` (no data is read)."""
    spark = frame.sparkSession
    text = spec.source
    words = re.sub(r"--[^\n]*|/\*.*?\*/", " ", text, flags=re.S).split(None, 1)
    if not words or words[0].upper().rstrip(";(") not in STATEMENT_WORDS:
        try:
            parsed = parse_sql_expression(spark, text)
        except ParseException as exc:
            return _syntax_problem(spec, exc)
        if parsed.kind == "Alias":  # Spark reads "a > 1 AND" as the condition named "AND"
            return FilterProblem(spec.path, line_at(text, len(text.rstrip())),
                                 f"SQL syntax error: unexpected '{parsed.name}' after the condition")
        return _analyze_condition(frame, spec, paths, text)
    try:
        parsed = parse_sql_statement(spark, text)
    except ParseException as exc:
        return _syntax_problem(spec, exc)
    return _analyze_query(frame, spec, paths, parsed)


def _analyze_condition(frame: DataFrame, spec: FilterSpec, paths: list[str], text: str) -> SqlShape | FilterProblem:
    try:
        verdict_type = frame.select(F.expr(text)).schema[0].dataType.simpleString()
        if verdict_type != "boolean":
            return FilterProblem(spec.path, 1, f"condition is of type {verdict_type}, not boolean")
        checked = frame.where(F.expr(text))
    except AnalysisException as exc:
        return FilterProblem(spec.path, _line_of(text, exc), explain(exc, paths))
    problem = _plan_problem(spec, checked, text, whole_query=False)
    return problem or SqlShape(text)


def _analyze_query(frame: DataFrame, spec: FilterSpec, paths: list[str], parsed: SqlTree
                   ) -> SqlShape | FilterProblem:
    top = parsed.kind
    if top not in ("Project", "Filter", "Aggregate", "Sort", "GlobalLimit", "LocalLimit", "Distinct", "Union",
                   "Intersect", "Except", "WithCTE", "Join", "Window", "Generate", "UnresolvedWith",
                   "Deduplicate", "UnresolvedHaving", "Offset"):
        return FilterProblem(spec.path, 1, f"{_statement_name(parsed)} statement: a filter only reads alerts "
                                           f"(DDL and DML are not allowed)")
    if top == "UnresolvedWith":
        return FilterProblem(spec.path, 1, PLAN_REASONS["WithCTE"])
    frame.createOrReplaceTempView(TABLE)
    try:
        query = frame.sparkSession.sql(spec.source)
        _ = query.schema  # analysed now, so its errors are this filter's
    except AnalysisException as exc:
        return FilterProblem(spec.path, _line_of(spec.source, exc), explain(exc, paths))
    problem = _plan_problem(spec, query, spec.source, whole_query=True)
    if problem:
        return problem
    if top != "Project" or parsed.children[0].kind != "Filter":
        return FilterProblem(spec.path, 1, "write SELECT <columns> FROM alerts WHERE <condition> "
                                           "(the WHERE condition is what the filter keeps)")
    condition = _source_of(spec.source, parsed.children[0].condition)
    selects, names = [], set()
    for index, item in enumerate(parsed.items):
        if item.kind in ("UnresolvedStar", "UnresolvedRegex"):
            return FilterProblem(spec.path, _line_at(spec.source, item),
                                 "SELECT * is the whole alert: name the columns (or use format full/nocutouts)")
        name = query.columns[index]
        if name in names:
            return FilterProblem(spec.path, _line_at(spec.source, item),
                                 f"two selected columns are named '{name}': give one an alias with AS")
        names.add(name)
        expression = item.children[0] if item.kind == "Alias" else item
        selects.append((name, _source_of(spec.source, expression)))
    return SqlShape(condition, tuple(selects))


def _plan_problem(spec: FilterSpec, analyzed: DataFrame, text: str, whole_query: bool) -> FilterProblem | None:
    """The first construct of the filter's own plan nodes that is not a per-alert row condition.

    The filter's nodes are those above the ``alerts`` relation (the whole
    query) or just the top ``Filter`` node (a bare condition).
    """
    own = _own_nodes(_tree(analyzed_plan_nodes(analyzed)), whole_query)
    for node in own:
        kind = node["class"].rsplit(".", 1)[-1]
        if kind in PLAN_REASONS:
            return FilterProblem(spec.path, 1, PLAN_REASONS[kind])
        if kind in ("SubqueryAlias", "View", "LocalRelation", "LogicalRDD") or kind.endswith("Relation"):
            return FilterProblem(spec.path, 1, "subqueries are not allowed: a filter looks at one alert at a time")
        for expression in _expressions(node):
            name = expression["class"].rsplit(".", 1)[-1]
            if name in SUBQUERY_EXPRESSIONS:
                return FilterProblem(spec.path, 1, "subqueries are not allowed: a filter looks at one alert at a time")
            if name in TIME_OR_PLACE_FUNCTIONS:
                return FilterProblem(spec.path, _line_of_function(text, name),
                                     f"{_function_label(name)} is not deterministic: a replayed night would "
                                     f"match differently (use the alert's own times, e.g. its MJD columns)")
    varying = nondeterministic_expressions(analyzed, len(own))
    if varying:
        return FilterProblem(spec.path, 1, f"'{varying[0]}' is not deterministic: a replayed night would match "
                                           f"differently")
    return None


def _tree(nodes: list[dict]) -> dict:
    """Nest the pre-order node list of ``TreeNode.toJSON`` (children under ``_children``)."""
    position = 0

    def build() -> dict:
        nonlocal position
        node = nodes[position]
        position += 1
        node["_children"] = [build() for _ in range(node.get("num-children", 0))]
        return node

    return build()


def _own_nodes(root: dict, whole_query: bool) -> list[dict]:
    """The filter's own plan nodes, top-down, stopping at the ``alerts`` relation."""
    if not whole_query:
        return [root]
    def is_alerts(node: dict) -> bool:
        return node["class"].endswith(".SubqueryAlias") and TABLE in str(node.get("identifier", ""))

    own, pending = [], [root]
    while pending:
        node = pending.pop(0)
        if is_alerts(node) or (node["class"].endswith(".SubqueryAlias") and len(node["_children"]) == 1
                               and is_alerts(node["_children"][0])):  # FROM alerts AS a
            continue
        own.append(node)
        pending.extend(node["_children"])
    return own


def _expressions(node: dict) -> list[dict]:
    """Every expression node stored in a plan node's JSON fields (flattened trees)."""
    found = []
    for value in node.values():
        if isinstance(value, list) and value is not node.get("_children"):
            for item in value:
                if isinstance(item, dict) and "class" in item:
                    found.append(item)
                elif isinstance(item, list):
                    found.extend(e for e in item if isinstance(e, dict) and "class" in e)
    return found


def _function_label(name: str) -> str:
    words = re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()
    return {"now": "now()", "rand": "rand()", "randn": "randn()", "uuid": "uuid()"}.get(words, f"{words}()")


def _line_of_function(text: str, name: str) -> int:
    label = _function_label(name)[:-2]
    position = text.lower().find(label)
    return line_at(text, position) if position >= 0 else 1


def _statement_name(parsed: SqlTree) -> str:
    words = re.sub(r"(?<!^)([A-Z])", r" \1", parsed.kind).upper()
    return words.replace(" STATEMENT", "").replace(" COMMAND", "")


def _source_of(text: str, node: SqlTree) -> str:
    return text[node.start: node.stop + 1] if node.start is not None and node.stop is not None else node.sql


def line_at(text: str, offset: int) -> int:
    """The 1-based line of a character offset."""
    return text[:offset].count("\n") + 1


def _line_at(text: str, node: SqlTree) -> int:
    return line_at(text, node.start) if node.start is not None else 1


def _position(text: str, exc: ParseException) -> int:
    """The character offset a parse error points at."""
    found = re.search(r"\(line (\d+), pos (\d+)\)", str(exc))
    if not found:
        return 0
    lines = text.split("\n")
    line, column = int(found.group(1)), int(found.group(2))
    return sum(len(row) + 1 for row in lines[: line - 1]) + column


def _syntax_problem(spec: FilterSpec, exc: ParseException) -> FilterProblem:
    text = spec.source
    offset = _position(text, exc)
    line = line_at(text, offset)
    before = re.sub(r"--[^\n]*", "", text[:offset]).rstrip()
    if (before.endswith(";") and before[:-1].strip()) or text[offset:offset + 1] == ";":
        return FilterProblem(spec.path, line, "several statements: a filter is one condition or one SELECT")
    return FilterProblem(spec.path, line, f"SQL syntax error: {first_line(exc)}")


def first_line(exc: Exception) -> str:
    """The first line of a Spark error, without its SQLSTATE suffix."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return re.sub(r"\s*SQLSTATE: \w+\.?;?.*$", "", text)


def _line_of(text: str, exc: AnalysisException) -> int:
    for context in exc.getQueryContext() or []:
        try:
            return line_at(text, context.startIndex())
        except Exception:  # noqa: BLE001 - a context without a position
            continue
    return 1


def explain(exc: AnalysisException, paths: list[str], column: str | None = None) -> str:
    """A plain reason for an analysis error, with the closest column name when it is a typo."""
    import difflib

    condition = exc.getCondition() if hasattr(exc, "getCondition") else exc.getErrorClass()
    params = exc.getMessageParameters() or {}
    if condition and (condition.startswith("UNRESOLVED_COLUMN") or condition == "FIELD_NOT_FOUND"):
        name = column or (exc.getQueryContext()[0].fragment() if exc.getQueryContext() else "")
        name = name or params.get("objectName", params.get("fieldName", "")).replace("`", "")
        watched = unknown_watch(name.replace("`", ""), paths)
        if watched:
            return watched
        close = difflib.get_close_matches(name, paths, n=1, cutoff=0.6)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return f"unknown column '{name}'{hint}"
    if condition == "UNRESOLVED_ROUTINE":
        return f"unknown function {params.get('routineName', '')}"
    if condition == "TABLE_OR_VIEW_NOT_FOUND":
        return f"unknown table {params.get('relationName', '')}: a filter reads FROM {TABLE} only"
    if condition and condition.startswith("DATATYPE_MISMATCH"):
        return f"type error: {first_line(exc)}"
    return first_line(exc)


def unknown_watch(name: str, paths: list[str]) -> str | None:
    """The reason for an unknown ``watchlists.<name>``/``watchmaps.<name>`` column when that list or map does
    not exist (None for other columns)."""
    import difflib

    column, _, rest = name.partition(".")
    if column.lower() not in ("watchlists", "watchmaps") or not rest:
        return None
    kind, wanted = column.lower()[:-1], rest.split(".")[0]
    known = [p.split(".")[1] for p in paths if p.lower().startswith(column.lower() + ".") and p.count(".") == 1]
    if wanted in known:
        return None
    close = difflib.get_close_matches(wanted, known, n=1, cutoff=0.6)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown {kind} '{wanted}'{hint}: add it with `skyfilter {kind} add {wanted} FILE`"
