"""The Confluent wire format: magic byte 0, a 4-byte big-endian schema id, then the Avro body."""

from __future__ import annotations

import struct

MAGIC_BYTE = 0
HEADER_SIZE = 5
_HEADER = struct.Struct(">bI")


class WireFormatError(ValueError):
    """A message that is not in the Confluent wire format."""


def frame(schema_id: int, avro_body: bytes) -> bytes:
    """Prefix an Avro body with the wire-format header for ``schema_id``."""
    return _HEADER.pack(MAGIC_BYTE, schema_id) + avro_body


def unframe(message: bytes) -> tuple[int, bytes]:
    """Split a message into (schema id, Avro body); raises WireFormatError if it is not framed."""
    if message is None or len(message) < HEADER_SIZE:
        raise WireFormatError(f"message of {0 if message is None else len(message)} bytes is "
                              f"shorter than the {HEADER_SIZE}-byte wire-format header")
    magic, schema_id = _HEADER.unpack_from(message)
    if magic != MAGIC_BYTE:
        raise WireFormatError(f"magic byte is {magic}, expected {MAGIC_BYTE}")
    return schema_id, message[HEADER_SIZE:]
