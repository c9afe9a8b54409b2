"""Visits of simulated alerts serialized once and kept on disk, so benchmarks time sending, not simulating.

DMTN-028 timed producers that send alerts already made; so do we.  A cache
file holds the Avro bodies (without the 5-byte wire header, whose schema id
belongs to a registry) of ``visits`` x ``alerts_per_visit`` simulated alerts;
:class:`CachedSource` replays them, each producer process loading only its
share before the clock starts.  Asking for more visits than the file holds
cycles through it (the same alerts again, under the same ids).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

from skyfilter.core.wire import HEADER_SIZE, frame
from skyfilter.producers.produce import AlertSource

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
    """``visits`` visits replayed from a cache file; a visit beyond the file's repeats one of its visits."""

    def __init__(self, path: Path, visits: int | None = None):
        self.path = path
        with path.open("rb") as handle:
            self.cached_visits, self.alerts_per_visit = LENGTH.unpack(handle.read(LENGTH.size))
        self.visits = visits or self.cached_visits
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
        for key, body in self._share[visit % self.cached_visits]:
            yield key, frame(self.schema_id, body)
