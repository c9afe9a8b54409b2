"""Visits of simulated alerts serialized once and kept on disk, so benchmarks time sending, not simulating.

DMTN-028 timed producers that send alerts already made; so do we.  A cache
file holds the Avro bodies (without the 5-byte wire header, whose schema id
belongs to a registry) of ``visits`` x ``alerts_per_visit`` simulated alerts;
:class:`CachedSource` replays them, each producer process loading only its
share before the clock starts.  Asking for more visits than the file holds
cycles through it: the same alerts again, each moved to the visit it is sent
as (:class:`VisitShift`), so that per-visit caps see a new visit every time.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

from skyfilter.producers.produce import AlertSource
from skyfilter.schemas.wire import HEADER_SIZE, frame

LENGTH = struct.Struct("<II")
NIGHT = "2026-11-21"
EARLIER_NIGHT = "2026-11-20"  # warm-up alerts: a night before the measured one, told apart by its ids


def cached_visits(cache_dir: Path, schema: dict, visits: int, alerts_per_visit: int, stamps: bool,
                  seed: int = 7, progress: bool = True, night: str = NIGHT) -> Path:
    """The cache file of these visits (of ``night``: its visit and alert ids), written first if need be."""
    from tqdm import tqdm

    from skyfilter.producers.sources import SimulatedSource

    version = schema.get("namespace", schema["name"].rsplit(".", 1)[0]).removeprefix("lsst.")  # e.g. v10_0
    path = cache_dir / (f"visits_{visits}x{alerts_per_visit}_{'stamps' if stamps else 'nostamps'}_seed{seed}"
                        f"{'' if night == NIGHT else '_' + night}{'' if version == 'v10_0' else '_' + version}.bin")
    if path.exists():
        return path
    cache_dir.mkdir(parents=True, exist_ok=True)
    source = SimulatedSource(schema, 0, night, visits, alerts_per_visit, seed=seed, stamps=stamps)
    partial = path.with_suffix(".partial")
    with partial.open("wb") as out, tqdm(total=visits * alerts_per_visit, unit="alert", disable=not progress,
                                         desc="simulating alerts for the cache") as bar:
        out.write(LENGTH.pack(visits, alerts_per_visit))
        for visit in range(visits):
            for key, value in source.messages(visit, 0, 1):
                body = value[HEADER_SIZE:]
                out.write(LENGTH.pack(len(key), len(body)))
                out.write(key)
                out.write(body)
                bar.update()
    partial.rename(path)
    return path


class CachedSource(AlertSource):
    """``visits`` visits replayed from a cache file; a visit beyond the file's repeats one of its visits, moved
    to its own visit id (which needs the alerts' ``schema``)."""

    def __init__(self, path: Path, visits: int | None = None, schema: dict | None = None):
        self.path = path
        with path.open("rb") as handle:
            self.cached_visits, self.alerts_per_visit = LENGTH.unpack(handle.read(LENGTH.size))
        self.visits = visits or self.cached_visits
        if self.visits > self.cached_visits and schema is None:
            raise ValueError("replaying more visits than the cache holds needs the schema to move their visit ids")
        self.shift = VisitShift(schema) if self.visits > self.cached_visits else None
        self.schema_id = 0
        self._share: list[list[tuple[bytes, bytes]]] | None = None

    def prepare(self, share: int, shares: int) -> None:
        self._share = [[] for _ in range(self.cached_visits)]
        with self.path.open("rb") as handle:
            handle.read(LENGTH.size)
            for visit in range(self.cached_visits):
                for index in range(self.alerts_per_visit):
                    key_size, body_size = LENGTH.unpack(handle.read(LENGTH.size))
                    if index % shares == share:
                        self._share[visit].append((handle.read(key_size), handle.read(body_size)))
                    else:
                        handle.seek(key_size + body_size, 1)

    def messages(self, visit: int, share: int, shares: int) -> Iterator[tuple[bytes, bytes]]:
        if self._share is None:
            self.prepare(share, shares)
        later = visit - visit % self.cached_visits
        for key, body in self._share[visit % self.cached_visits]:
            if later:
                key, body = self.shift.moved(key, body, later)
            yield key, frame(self.schema_id, body)


class VisitShift:
    """A simulated alert's Avro body moved ``n`` visits later: ``diaSource.visit`` + n, and its alert ids (the
    simulator's ``visit_id * 100000 + index``) with it; every other byte is kept, so no re-encoding is needed.

    Works on schemas whose fields before ``diaSource.visit`` are primitive or unions of primitives (every Rubin
    version the benchmarks use)."""

    IDS = ("diaSourceId", "alertId")
    ID_STEP = 100000

    def __init__(self, schema: dict):
        self.top = schema["fields"]
        source = next(f for f in self.top if f["name"] == "diaSource")["type"]
        self.inner = source["fields"]

    def moved(self, key: bytes, body: bytes, visits: int) -> tuple[bytes, bytes]:
        """(Kafka key, body) of the same alert ``visits`` visits later."""
        out, position, new_id = [], 0, None
        for field in self.top:
            if field["name"] == "diaSource":
                for inner in self.inner:
                    position, new_id = self._field(body, position, inner, visits, out, new_id)
                    if inner["name"] == "visit":
                        out.append(body[position:])
                        return (key if new_id is None else str(new_id).encode()), b"".join(out)
            position, new_id = self._field(body, position, field, visits, out, new_id)
        raise ValueError("schema has no diaSource.visit")

    def _field(self, body: bytes, position: int, field: dict, visits: int, out: list, new_id):
        end = _skip(body, position, field["type"])
        if field["name"] == "visit" or (field["name"] in self.IDS and field["type"] == "long"):
            value, _ = _varint(body, position)
            value += visits if field["name"] == "visit" else visits * self.ID_STEP
            out.append(_zigzag(value))
            return end, value if field["name"] in self.IDS else new_id
        out.append(body[position:end])
        return end, new_id


def _varint(data: bytes, position: int) -> tuple[int, int]:
    """(value, next position) of an Avro zig-zag varint."""
    shift = number = 0
    while True:
        byte = data[position]
        position += 1
        number |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (number >> 1) ^ -(number & 1), position


def _zigzag(value: int) -> bytes:
    number, out = (value << 1) ^ (value >> 63), bytearray()
    while number > 0x7F:
        out.append((number & 0x7F) | 0x80)
        number >>= 7
    out.append(number)
    return bytes(out)


def _skip(data: bytes, position: int, avro_type) -> int:
    """The position after one value of a primitive type, or of a union of them."""
    if isinstance(avro_type, list):
        branch, position = _varint(data, position)
        return _skip(data, position, avro_type[branch])
    if avro_type in ("long", "int"):
        return _varint(data, position)[1]
    if avro_type in ("string", "bytes"):
        size, position = _varint(data, position)
        return position + size
    sizes = {"null": 0, "boolean": 1, "float": 4, "double": 8}
    if avro_type not in sizes:
        raise ValueError(f"cannot move a visit past a field of type {avro_type}")
    return position + sizes[avro_type]
