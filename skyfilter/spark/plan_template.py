"""The analysed plan of one delivery batch, replayed over the next batches' rows: one of Spark's private APIs,
registered with the others of ``skyfilter/spark/internals.py`` (a reason and a probe each)."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, Observation, SparkSession

from skyfilter.spark.internals import internal

WHY_TEMPLATE = ("Spark analyses every DataFrame operation again; replaying an analysed plan on a new batch's rows "
                "(0.2-0.9 s of driver time per delivery batch saved) needs Catalyst's plan classes")

# Only three things change from one delivery batch to the next: its rows (the plan's leaf) and two literals (its
# id, the caps' memory). PlanTemplate keeps one batch's analysed plan, rebuilds its one-child spine on the next
# batch's leaf with that batch's literals, and hands Spark a plan already marked analysed (Spark still optimises
# and plans it). A plan that is not a single chain, or a leaf of another shape, makes of() or apply() say no, and
# the caller builds the batch as usual.


@dataclass
class _Site:
    """A literal the batch sets: below the alias ``name`` at ``position`` in the projection of spine node ``node``.

    ``chain`` holds the expressions from the alias down to the literal's parent, ``data_type`` the literal's type.
    """

    node: int
    position: int
    name: str
    chain: list
    data_type: object


class PlanTemplate:
    """The analysed plan of one batch's DataFrame, replayed over other batches' rows (see the module)."""

    def __init__(self, spark: SparkSession, spine: list, leaf, sites: list[_Site], metrics: tuple[str, int] | None):
        jvm = spark.sparkContext._jvm
        self.spine = spine  # root first, down to the leaf's parent
        self.leaf_schema = leaf.schema().json()
        self.leaf_output = leaf.output()
        self.leaf_ids = self.leaf_output.toString()
        self.sites = sites
        self.metrics = metrics  # (name, dataframe id) of the plan's observe, if any
        self._renaming: tuple[str, object] | None = None  # (leaf ids, their aliases) of the last renamed leaf
        self._jvm = jvm
        self._option = jvm.scala.Option
        self._to_seq = jvm.org.apache.spark.api.python.PythonUtils.toSeq
        self._project = jvm.org.apache.spark.sql.catalyst.plans.logical.Project
        self._literal = jvm.org.apache.spark.sql.catalyst.expressions.Literal
        self._dataset = getattr(jvm, "org.apache.spark.sql.classic.Dataset")

    @classmethod
    @internal(WHY_TEMPLATE)
    def of(cls, frame: DataFrame, leaf: DataFrame, literals: tuple[str, ...]) -> PlanTemplate | None:
        """The template of ``frame``, built on the rows of ``leaf``; ``literals`` name the aliases of per-batch
        string literals.  None when the plan is not a chain of one-child operators ending at ``leaf``'s plan."""
        root = frame._jdf.queryExecution().analyzed()
        identity = frame.sparkSession.sparkContext._jvm.System.identityHashCode
        bottom = identity(leaf._jdf.queryExecution().analyzed())
        spine, sites, metrics, node = [], [], None, root
        while identity(node) != bottom:
            if node.children().size() != 1:
                return None
            spine.append(node)
            name = node.nodeName()
            if name == "CollectMetrics":
                if metrics is not None:
                    return None
                metrics = (node.name(), node.dataframeId())
            elif name == "Project":
                items = node.projectList()
                for position in range(items.size()):
                    item = items.apply(position)
                    if item.nodeName() == "Alias" and item.name() in literals:
                        site = _literal_site(len(spine) - 1, position, item)
                        if site is None:
                            return None
                        sites.append(site)
            node = node.children().apply(0)
        return cls(frame.sparkSession, spine, node, sites, metrics)

    @internal(WHY_TEMPLATE)
    def apply(self, leaf: DataFrame, values: dict[str, str]) -> tuple[DataFrame, Observation | None] | None:
        """The template's DataFrame over ``leaf``'s rows with ``values`` in its literals, and the observation
        that will hold the figures of its observe (None without one); None when ``leaf``'s columns are not
        the template leaf's."""
        from pyspark.sql.classic.dataframe import DataFrame as ClassicFrame

        rows = leaf._jdf.queryExecution().analyzed()
        if rows.schema().json() != self.leaf_schema:
            return None
        plan = self._bound(rows)
        by_node: dict[int, list[_Site]] = {}
        for site in self.sites:
            by_node.setdefault(site.node, []).append(site)
        for index in range(len(self.spine) - 1, -1, -1):
            node = self.spine[index]
            if index in by_node:
                items = node.projectList()
                for site in by_node[index]:
                    items = items.updated(site.position, self._with_literal(site, values[site.name]))
                plan = self._project(items, plan)
            else:
                plan = node.withNewChildren(self._one(plan))
        plan.setAnalyzed()
        session = leaf.sparkSession  # a streaming query's batches run in its own session, with its settings
        return ClassicFrame(self._dataset.ofRows(session._jsparkSession, plan), session), self._observation(session)

    def _bound(self, leaf):
        """``leaf`` itself when its columns carry the template leaf's ids, else a projection renaming them so
        (the renaming is kept for the next leaf with the same ids: a stream's batches all have them)."""
        ids = leaf.output().toString()
        if ids == self.leaf_ids:
            return leaf
        if self._renaming is None or self._renaming[0] != ids:
            expressions = self._jvm.org.apache.spark.sql.catalyst.expressions
            empty, output, aliases = self._to_seq([]), leaf.output(), []
            for index in range(output.size()):
                wanted = self.leaf_output.apply(index)
                aliases.append(expressions.Alias(output.apply(index), wanted.name(), wanted.exprId(), empty,
                                                 self._option.empty(), empty))
            self._renaming = ids, self._to_seq(aliases)
        return self._project(self._renaming[1], leaf)

    def _with_literal(self, site: _Site, value: str):
        """The site's alias over a new literal holding ``value``."""
        expression = self._literal.create(value, site.data_type)
        for parent in reversed(site.chain):
            expression = parent.withNewChildren(self._one(expression))
        return expression

    def _observation(self, session: SparkSession) -> Observation | None:
        """The observation the session completes when the plan's ``observe`` has its figures."""
        if self.metrics is None:
            return None
        name, dataframe_id = self.metrics
        observation = Observation(name)
        observation._jvm = self._jvm
        observation._jo = session._jsparkSession.observationManager().getOrNewObservation(name, dataframe_id)
        return observation

    def _one(self, item):
        """A one-element Scala sequence (two JVM calls)."""
        return self._option.apply(item).toList()


def _literal_site(node: int, position: int, alias) -> _Site | None:
    """The site of the literal below ``alias`` through one-child expressions (an alias of a literal, or of a
    cast of one); None when there is no such literal."""
    chain, expression = [], alias
    while expression.nodeName() != "Literal":
        children = expression.children()
        if children.size() != 1:
            return None
        chain.append(expression)
        expression = children.apply(0)
    return _Site(node, position, alias.name(), chain, expression.dataType())
