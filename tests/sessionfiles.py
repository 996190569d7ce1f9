"""Session files in the version 1 format (gzip-compressed JSON), which
``aprof.load`` still reads: the tests that craft damaged or edited sessions
edit that document, and the loader checks it as it checks version 2."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import aprof


def v1_document(prof: aprof.profile | aprof.Session) -> dict[str, Any]:
    """The session as a version 1 document, as plain JSON values."""
    session = prof.session if isinstance(prof, aprof.profile) else prof
    return json.loads(json.dumps(session._to_json(), allow_nan=False))


def v1_bytes(doc: dict[str, Any]) -> bytes:
    return gzip.compress(json.dumps(doc).encode())


def save_v1(prof: aprof.profile | aprof.Session, path: Path) -> dict[str, Any]:
    """Write ``prof``'s session to ``path`` in version 1; return the document."""
    doc = v1_document(prof)
    path.write_bytes(v1_bytes(doc))
    return doc


def v2_parts(raw: bytes) -> tuple[dict[str, Any], dict[str, bytes]]:
    """A version 2 file's header and its blocks (inflated), by name."""
    import struct
    import zlib

    _, version, size, _ = struct.unpack_from("<8sIII", raw)
    assert version == 2
    header = json.loads(raw[20 : 20 + size])
    body = raw[20 + size :]
    blocks = {}
    for b in header["blocks"]:
        data = body[b["offset"] : b["offset"] + b["size"]]
        blocks[b["name"]] = zlib.decompress(data) if header["compression"] == "zlib" else data
    return header, blocks


def v2_bytes(header: dict[str, Any], blocks: dict[str, bytes], compression: str = "none") -> bytes:
    """A version 2 file of ``header`` and ``blocks``, written uncompressed,
    with lengths, offsets and checksums made to match (so only the damage
    a test puts in the values themselves is left for the loader to find)."""
    import struct
    import zlib

    header = {**header, "compression": compression, "blocks": []}
    offset = 0
    for name, data in blocks.items():
        header["blocks"].append(
            {"name": name, "offset": offset, "size": len(data), "raw_size": len(data), "crc32": zlib.crc32(data)}
        )
        offset += len(data)
    text = json.dumps(header).encode()
    return struct.pack("<8sIII", b"\x89APROF\r\n", 2, len(text), zlib.crc32(text)) + text + b"".join(blocks.values())
