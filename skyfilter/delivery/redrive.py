"""Dead letters the stream can read now go back through it: the re-drive at each start.

An alert is dead-lettered for its schema when its id was not registered yet,
or when the running reader could not read its version (one that becomes the
reader only at the next start).  Once the reader reads that id, its letters
are produced again onto the input topic, bytes and key unchanged, with a
``redriven_from`` header naming the letter; the stream then reads them like
any alert.  The letters re-driven are remembered in the stream's checkpoint
folder, so none goes twice.  Letters of a body that does not decode, or of a
version the reader never reads, stay where they are.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from confluent_kafka import Producer

from skyfilter.core.config import Config
from skyfilter.core.errors import SkyfilterError
from skyfilter.filtering.input_schemas import InputSchemas
from skyfilter.kafka.clients import client_settings
from skyfilter.kafka.read_back import read_topic
from skyfilter.schemas.wire import WireFormatError, unframe

logger = logging.getLogger(__name__)

SCHEMA_REASON = "schema id "  # the reasons the schema policy gives (not registered, cannot be read)


def redrive_dead_letters(cfg: Config, topic: str, inputs: InputSchemas, checkpoint: Path) -> int:
    """Produce again onto ``topic`` its dead letters that ``inputs`` now reads; returns how many."""
    letters_topic = f"{topic}.deadletter"
    done_file = checkpoint / "redriven.json"
    done = set(json.loads(done_file.read_text())) if done_file.exists() else set()
    chosen = []
    try:
        letters = read_topic(cfg, letters_topic)
    except SkyfilterError as exc:
        logger.warning(f"re-drive: {exc}; the dead letters stay, the next start looks again")
        return 0
    for letter in letters:
        where = f"{letter.partition}/{letter.offset}"
        if where in done or letter.headers.get("source_topic") != topic or \
                not letter.headers.get("reason", "").startswith(SCHEMA_REASON):
            continue
        try:
            schema_id, _ = unframe(letter.value or b"")
        except WireFormatError:
            continue
        if schema_id in inputs.readable:
            chosen.append((where, letter))
    if not chosen:
        return 0
    producer = Producer(client_settings(cfg, acks="all", log_level=0, **{"enable.idempotence": True}))
    for where, letter in chosen:
        producer.produce(topic, key=letter.key, value=letter.value,
                         headers=[("redriven_from", f"{letters_topic}/{where}".encode())])
    if producer.flush(60) != 0:
        raise SkyfilterError(f"could not re-drive {len(chosen)} dead letter(s) to '{topic}' at "
                             f"{cfg.bootstrap_servers}")
    done_file.parent.mkdir(parents=True, exist_ok=True)
    done_file.write_text(json.dumps(sorted(done | {where for where, _ in chosen})))
    ids = sorted({unframe(letter.value)[0] for _, letter in chosen})
    logger.info(f"re-drove {len(chosen)} dead letter(s) of schema id(s) {', '.join(map(str, ids))} to '{topic}': the "
                f"stream reads them now")
    return len(chosen)
