"""Where alerts come from: the simulator, or real Avro files replayed byte for byte."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import fastavro
from fastavro.schema import parse_schema

from skyfilter.core.alert_columns import alert_id_of, detect
from skyfilter.core.errors import SkyfilterError
from skyfilter.producers.produce import AlertSource
from skyfilter.producers.simulate import AlertSimulator
from skyfilter.schemas.avro import avro_files, fingerprint, read_container
from skyfilter.schemas.wire import frame


class SimulatedSource(AlertSource):
    """Visits of simulated Rubin alerts, serialized by each producer process itself.

    With ``ahead``, a process serializes its share of every visit before the first
    visit's clock starts (:meth:`prepare`) and then only sends, as with the benchmarks'
    cached visits: the simulation's CPU stays out of the visits (memory: every alert
    of the run).
    """

    def __init__(self, schema: dict, schema_id: int, night: str, visits: int, alerts_per_visit: int,
                 seed: int = 0, stamps: bool = True, history_length: int = 30, interval_s: float = 39.0,
                 stamp_size: int = 100, first_visit: int = 1, ahead: bool = False):
        self.schema = schema
        self.schema_id = schema_id
        self.visits = visits
        self.alerts_per_visit = alerts_per_visit
        self.first_index = first_visit - 1
        self.simulator = AlertSimulator(schema, night, seed, stamps, history_length, stamp_size, interval_s)
        self.ahead = ahead
        self._parsed = None
        self._ready: dict[tuple[int, int], list[list[tuple[bytes, bytes]]]] = {}

    def visit_id(self, visit: int) -> int:
        return self.simulator.visit(self.first_index + visit).visit_id

    def prepare(self, share: int, shares: int) -> None:
        if self.ahead and (share, shares) not in self._ready:
            self._ready[share, shares] = [list(self._bodies(visit, share, shares)) for visit in range(self.visits)]

    def messages(self, visit: int, share: int, shares: int) -> Iterator[tuple[bytes, bytes]]:
        ready = self._ready.get((share, shares))
        bodies = iter(ready[visit]) if ready is not None else self._bodies(visit, share, shares)
        # framed when sent: the schema id is known only once the schema is registered
        return ((key, frame(self.schema_id, body)) for key, body in bodies)

    def _bodies(self, visit: int, share: int, shares: int) -> Iterator[tuple[bytes, bytes]]:
        """(key, Avro body) of the alerts of ``visit`` in this share, simulated and serialized now."""
        if self._parsed is None:
            self._parsed = parse_schema(self.schema, _write_hint=False)
        pointing = self.simulator.visit(self.first_index + visit)
        buffer = io.BytesIO()
        for index in range(share, self.alerts_per_visit, shares):
            alert = self.simulator.alert(pointing, index)
            buffer.seek(0)
            buffer.truncate()
            fastavro.schemaless_writer(buffer, self._parsed, alert)
            yield str(alert["diaSource"]["diaSourceId"]).encode(), buffer.getvalue()


class FileSource(AlertSource):
    """Alerts read from Avro container files, each record's bytes kept exactly as written.

    All files must share one schema (one topic carries one schema).  They are
    sent as a single burst ("visit").
    """

    def __init__(self, paths: list[str | Path]):
        self.files = avro_files(paths)
        self.schema: dict | None = None
        self.keys: list[bytes] = []
        self.bodies: list[bytes] = []
        first_fingerprint = None
        for path in self.files:
            schema, records = read_container(path)
            if first_fingerprint is None:
                self.schema, first_fingerprint = schema, fingerprint(schema)
                self.columns = detect(schema)
            elif fingerprint(schema) != first_fingerprint:
                raise SkyfilterError(f"{path}: its schema differs from that of {self.files[0]}; "
                                     f"one topic carries one schema, so produce these files separately")
            for item in records:
                self.keys.append(str(alert_id_of(item.record, self.columns)).encode())
                self.bodies.append(item.body)
        self.schema_id = 0
        self.visits = 1
        self.alerts_per_visit = len(self.bodies)

    def messages(self, visit: int, share: int, shares: int) -> Iterator[tuple[bytes, bytes]]:
        for index in range(share, len(self.bodies), shares):
            yield self.keys[index], frame(self.schema_id, self.bodies[index])
