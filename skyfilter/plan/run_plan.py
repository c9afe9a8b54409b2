"""What one run of the stream job decides before it reads an alert, settled in one place.

A run's decisions are: which lanes this process runs and whether the archive
runs in a process of its own; each lane's trigger (``--trigger auto`` becomes
``realtime`` or ``0``); the task slots each lane gets; and which brokers
Real-time Mode serves.  :func:`settle_run` makes them from the config and the
filter and broker files (read once: :mod:`skyfilter.plan.stream_files`), for
the master Spark runs on, before Spark starts (the session's size depends on
them); the job runs what the returned :class:`RunPlan` says and decides none of
it again.  It only sizes the lanes' task slots, once Kafka says how many
partitions the topic has (and on a cluster once Spark says how many cores it
has).  Which broker goes to Real-time Mode follows one rule,
:func:`realtime_refusal`, whether read from the files or from a stream plan.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from skyfilter.core.brokers import BrokerSpec
from skyfilter.core.config import Config
from skyfilter.core.config_types import Realtime
from skyfilter.core.errors import SkyfilterError
from skyfilter.core.filter_loader import FilterSpec
from skyfilter.core.lane_names import LANE_CHOICES, LaneName
from skyfilter.kafka.topics import topic_partitions
from skyfilter.plan.slots import Slots, local_cores, plan_slots
from skyfilter.plan.stream_files import StreamFiles, read_stream_files
from skyfilter.plan.tables import raw_layout, table_paths
from skyfilter.plan.triggers import AVAILABLE_NOW, REALTIME, Triggers, duration
from skyfilter.watch.columns import references


@dataclass(frozen=True)
class BrokerNeeds:
    """What decides a broker's lane: a per-visit cap, Python filters, filters that use watchlists or watchmaps."""

    capped: bool
    python: tuple[str, ...] = ()
    watch: bool = False

    @classmethod
    def of(cls, broker: BrokerSpec, filters: list[str], python: set[str], watching: set[str]) -> BrokerNeeds:
        """The needs of ``broker`` running ``filters``, of which ``python`` are Python and ``watching`` name a
        list or map (a subscription ``watchlist:NAME`` always does)."""
        return cls(broker.max_alerts_per_visit is not None, tuple(f for f in filters if f in python),
                   any(":" in f or f in watching for f in filters))

    @classmethod
    def in_plan(cls, broker: BrokerSpec, filters: list[FilterSpec]) -> BrokerNeeds:
        """The needs of ``broker`` running its working filters, of a stream plan's ``filters``."""
        python = {spec.name for spec in filters if spec.kind == "python"}
        return cls(broker.max_alerts_per_visit is not None,
                   tuple(f for f in broker.enabled_filters if f in python), bool(broker.watch_matches))


def realtime_refusal(needs: BrokerNeeds, settings: Realtime) -> str | None:
    """Why a broker with these needs is not served in Real-time Mode, or None: the one rule (the same on every
    master: filter workers run beside each executor, caps are asked of the driver's ledger)."""
    reasons = []
    if needs.capped and not settings.caps:
        reasons.append("a per-visit cap (stream.realtime.caps is off)")
    python = ", ".join(needs.python)
    if python and not settings.python_filters:
        reasons.append(f"Python filter(s) {python} (stream.realtime.python_filters is off)")
    return "; ".join(reasons) or None


def broker_needs(files: StreamFiles) -> dict[str, BrokerNeeds]:
    """Each broker's needs from what its files say, before Spark starts."""
    names, python = files.names, files.python
    watching = {spec.name for spec in files.filters if references(spec)}
    return {broker.name: BrokerNeeds.of(broker, [f for f in broker.filters if f in names or ":" in f], python,
                                        watching)
            for broker in files.brokers}


@dataclass(frozen=True)
class RunPlan:
    """The settled decisions of one run of the stream job (never changed once made)."""

    name: str                  # the stream: its checkpoints and Delta tables
    topic: str
    lanes: frozenset[LaneName]     # the lanes this process runs (LaneName.DELIVERY stands for both delivery forms)
    archive_apart: bool        # the archive lane runs in a process of its own, started by this one
    triggers: Triggers
    slots: Slots
    master: str                # Spark's master the decisions were made for
    batch_brokers: tuple[tuple[str, str], ...] = ()  # with Real-time Mode: (broker, why) left to micro-batches
    archive_writer: str = "spark"  # who writes the archive: spark (its queries) or delta-rs (no Spark)

    @property
    def local_master(self) -> bool:
        return local_cores(self.master) is not None

    @property
    def realtime(self) -> bool:
        """Whether delivery runs in Real-time Mode."""
        return LaneName.DELIVERY in self.lanes and self.triggers.delivery == REALTIME

    @property
    def micro_batches(self) -> bool:
        """Whether delivery runs micro-batches (alone, or beside Real-time Mode for some brokers)."""
        return LaneName.DELIVERY in self.lanes and (not self.realtime or bool(self.batch_brokers))

    @property
    def archive_here(self) -> bool:
        """Whether this process runs the archive lane's queries."""
        return LaneName.ARCHIVE in self.lanes and not self.archive_apart


def settle_triggers(cfg: Config, available_now: bool, needs: dict[str, BrokerNeeds]) -> tuple[Triggers, str]:
    """Each lane's trigger, and for ``--trigger auto`` the line saying what it chose (checked here, so a typo is
    one line before Spark starts)."""
    if available_now:
        return Triggers(AVAILABLE_NOW, AVAILABLE_NOW, "", AVAILABLE_NOW), ""
    delivery, why = cfg.stream.trigger.strip().lower(), ""
    if delivery == "auto":
        misfits = [name for name, need in needs.items()
                   if realtime_refusal(need, cfg.stream.realtime) is not None]
        delivery = "0" if misfits else REALTIME
        why = (f"trigger auto -> {delivery}: " + (f"broker(s) {', '.join(misfits)} need micro-batches "
               f"(stream.realtime settings): micro-batches back to back" if misfits else
               "Real-time Mode serves every broker (SQL and Python filters, caps)"))
    if delivery != REALTIME:
        delivery = "0s" if duration(delivery) == "0 seconds" else delivery
    archive, archive_log = cfg.archive.trigger.strip(), cfg.archive.log_trigger.strip()
    duration(archive)
    duration(archive_log)
    return Triggers(delivery, archive, duration(cfg.stream.realtime.checkpoint_interval), archive_log), why


def archive_apart(cfg: Config, lanes: frozenset[LaneName], available_now: bool, local_master: bool) -> bool:
    """Whether the archive lane runs in a process of its own (``archive.process``: ``auto`` = yes on a local
    master when the job runs both lanes until stopped; ``separate``; ``same``)."""
    if available_now or lanes != LANE_CHOICES["both"]:
        return False
    mode = cfg.archive.process.strip().lower()
    if mode not in ("auto", "same", "separate"):
        raise SkyfilterError(f"archive.process is '{mode}': use auto, same or separate")
    return mode == "separate" or (mode == "auto" and local_master)


def settle_archive_writer(cfg: Config, name: str) -> tuple[str, str]:
    """Who writes the archive (``spark`` or ``delta-rs``), and why ``auto`` chose Spark ("" otherwise); one line
    for an ``archive.writer`` the archive cannot use."""
    writer = cfg.archive.writer
    if writer not in ("auto", "spark", "delta-rs"):
        raise SkyfilterError(f"archive.writer is '{writer}': use auto, spark or delta-rs")
    if writer == "delta-rs" and cfg.stream.nightly_topics.enabled:
        raise SkyfilterError("archive.writer delta-rs does not copy alerts to nightly topics yet: with "
                             "stream.nightly_topics.enabled use archive.writer spark")
    if writer != "auto":
        return writer, ""
    if cfg.stream.nightly_topics.enabled:
        return "spark", "archive.writer auto: Spark writes the archive (delta-rs copies no alerts to nightly topics)"
    alerts = table_paths(cfg, name)["alerts"]
    if raw_layout(alerts) is False:
        return "spark", (f"archive.writer auto: Spark writes the archive ({alerts} holds the layout before the raw "
                         f"one, which delta-rs does not write)")
    return "delta-rs", ""


def settle_run(cfg: Config, name: str, lane_choice: str, available_now: bool, master: str,
               files: StreamFiles | None = None) -> tuple[RunPlan, str]:
    """The run plan of ``filter_stream.py`` on Spark master ``master``, from the config and the filter and broker
    ``files`` alone (before Kafka is asked anything: a typo is one line at once; None: read here when needed),
    and the ``--trigger auto`` line ("" without it).  Its slots follow from :func:`with_slots`."""
    local = local_cores(master) is not None
    writer, why_spark = settle_archive_writer(cfg, name)
    lanes = LANE_CHOICES[lane_choice]
    # only Real-time Mode (asked for, or maybe chosen by auto) needs each broker's needs
    wanted = LaneName.DELIVERY in lanes and not available_now and \
        cfg.stream.trigger.strip().lower() in ("auto", REALTIME)
    if wanted and files is None:
        files = read_stream_files(cfg.path("stream.filters_dir"), cfg.path("stream.brokers"))
    needs = broker_needs(files) if wanted else {}
    triggers, why = settle_triggers(cfg, available_now, needs)
    run = RunPlan(name, cfg.topics.alerts, lanes, archive_apart(cfg, lanes, available_now, local), triggers,
                  Slots(0, 0, 0, 0), master, archive_writer=writer)
    if run.realtime:
        run = replace(run, batch_brokers=tuple(
            (broker, reason) for broker, need in needs.items()
            if (reason := realtime_refusal(need, cfg.stream.realtime)) is not None))
    return run, "\n".join(line for line in (why, why_spark) if line)


def with_slots(run: RunPlan, cfg: Config, cores: int | None = None) -> RunPlan:
    """``run`` with each lane's task slots: delivery gets ``stream.tasks``, or the cores of a local master, or
    ``cores`` (a cluster's).  Real-time Mode's come from the input topic's partitions (asked of Kafka)."""
    partitions = (topic_partitions(cfg, run.topic) or cfg.topics.alerts_partitions) if run.realtime else 0
    slots = plan_slots(cfg, local_cores(run.master) or cores or 1, partitions, run.micro_batches, run.archive_here)
    return replace(run, slots=slots)


def fit_to_slots(run: RunPlan, cfg: Config, available: int) -> tuple[RunPlan, str]:
    """Under ``--trigger auto``, micro-batches when Spark has fewer task slots than Real-time Mode's long-lived
    tasks and the other lanes need (a small cluster); with the line saying so ("" when Real-time Mode fits).
    An explicit ``--trigger realtime`` is left to fail with the slots it needs."""
    need = run.slots.realtime_need
    if not run.realtime or cfg.stream.trigger.strip().lower() != "auto" or available >= need:
        return run, ""
    batches = replace(run, triggers=replace(run.triggers, delivery="0s"), batch_brokers=())
    return with_slots(batches, cfg, available), (
        f"trigger auto -> 0: Real-time Mode needs {need} task slots here (one per partition of '{run.topic}', "
        f"{run.slots.realtime}, and the other lanes') and Spark has {available}: micro-batches back to back "
        f"(more executor cores bring Real-time Mode back)")
