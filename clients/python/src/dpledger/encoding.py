"""The compact binary step encoding ``DPLS`` version 1 (the workspace crate's
``crates/dpledger-api/src/codec.rs`` documents it byte by byte; Content-Type
``application/octet-stream``).

All integers little-endian::

    magic "DPLS" | version u8 = 1 | flags u8 | step u64
    [part index u32, part count u32]      if flags bit 0
    [noise_multiplier f64]                if flags bit 1
    [sampling_rate f64]                   if flags bit 2
    n_ids u64 | n_norms u64
    ids: n_ids x u64, or (flags bit 3) LEB128 varints: first id, then gaps >= 1
    norms: n_norms x f64 (IEEE 754 bits, copied bit for bit)
    CRC-32 (IEEE, as zlib computes it) of every preceding byte, u32

:func:`encode_step` writes exactly what the server's ``StepPayload::encode``
writes (delta-encoded ids when they are strictly increasing and that is
smaller), so equal reports give equal bytes on both sides.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any, Iterable, List, Optional, Sequence, Tuple

from .errors import EncodingError
from .types import Part, StepReport

__all__ = ["CONTENT_TYPE", "MAGIC", "VERSION", "encode_step", "decode_step"]

CONTENT_TYPE = "application/octet-stream"
MAGIC = b"DPLS"
VERSION = 1

FLAG_PART = 1 << 0
FLAG_NOISE = 1 << 1
FLAG_RATE = 1 << 2
FLAG_DELTA_IDS = 1 << 3
KNOWN_FLAGS = FLAG_PART | FLAG_NOISE | FLAG_RATE | FLAG_DELTA_IDS
_U64_MAX = (1 << 64) - 1


def _as_list(values: Any) -> list:
    if hasattr(values, "tolist"):
        values = values.tolist()
    return list(values)


def _varint(value: int, out: bytearray) -> None:
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return


def _varint_len(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def _delta_len(ids: Sequence[int]) -> Optional[int]:
    if not ids:
        return None
    total = _varint_len(ids[0])
    previous = ids[0]
    for i in ids[1:]:
        if i <= previous:
            return None
        total += _varint_len(i - previous)
        previous = i
    return total


def encode_step(
    step: int,
    ids: Iterable[int],
    norms: Iterable[float],
    *,
    part: Optional[Tuple[int, int] | Part] = None,
    noise_multiplier: Optional[float] = None,
    sampling_rate: Optional[float] = None,
    delta_ids: Optional[bool] = None,
) -> bytes:
    """Encode one step report (or part). ``ids`` and ``norms`` may be lists,
    numpy arrays or tensors; their order is kept. ``delta_ids``: ``None`` picks
    the delta encoding exactly when the server's encoder would (strictly
    increasing ids, and smaller); ``True`` demands it (ValueError if the ids are
    not strictly increasing); ``False`` always writes 8 bytes per id."""
    ids = [int(i) for i in _as_list(ids)]
    norms = [float(g) for g in _as_list(norms)]
    if not 0 <= step <= _U64_MAX:
        raise ValueError(f"step {step} does not fit in a u64")
    for j, i in enumerate(ids):
        if not 0 <= i <= _U64_MAX:
            raise ValueError(f"ids[{j}] = {i} does not fit in a u64")
    if isinstance(part, Part):
        part = (part.index, part.count)
    delta_len = _delta_len(ids)
    if delta_ids is None:
        use_delta = delta_len is not None and delta_len < 8 * len(ids)
    elif delta_ids:
        if delta_len is None:
            raise ValueError("delta-encoded ids must be strictly increasing (and not empty)")
        use_delta = True
    else:
        use_delta = False
    flags = 0
    if part is not None:
        flags |= FLAG_PART
    if noise_multiplier is not None:
        flags |= FLAG_NOISE
    if sampling_rate is not None:
        flags |= FLAG_RATE
    if use_delta:
        flags |= FLAG_DELTA_IDS
    out = bytearray(MAGIC)
    out += struct.pack("<BBQ", VERSION, flags, step)
    if part is not None:
        out += struct.pack("<II", int(part[0]), int(part[1]))
    if noise_multiplier is not None:
        out += struct.pack("<d", float(noise_multiplier))
    if sampling_rate is not None:
        out += struct.pack("<d", float(sampling_rate))
    out += struct.pack("<QQ", len(ids), len(norms))
    if use_delta:
        previous = 0
        for j, i in enumerate(ids):
            _varint(i if j == 0 else i - previous, out)
            previous = i
    else:
        out += struct.pack(f"<{len(ids)}Q", *ids)
    out += struct.pack(f"<{len(norms)}d", *norms)
    out += struct.pack("<I", zlib.crc32(out) & 0xFFFFFFFF)
    return bytes(out)


class _Reader:
    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int, name: str) -> bytes:
        if self.remaining() < n:
            raise EncodingError(
                f"step payload truncated: {name} needs {n} bytes at offset {self.pos}, "
                f"only {self.remaining()} remain"
            )
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def unpack(self, fmt: str, name: str):
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, self.take(size, name))

    def varint(self, index: int) -> int:
        start = self.pos
        value = 0
        for k in range(10):
            if self.pos >= len(self.data):
                raise EncodingError(
                    f"malformed delta-encoded id {index} at offset {start}: truncated varint"
                )
            byte = self.data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << (7 * k)
            if not byte & 0x80:
                if k > 0 and byte == 0:
                    raise EncodingError(
                        f"malformed delta-encoded id {index} at offset {start}: "
                        "superfluous trailing zero group"
                    )
                if value > _U64_MAX:
                    raise EncodingError(
                        f"malformed delta-encoded id {index} at offset {start}: overflows u64"
                    )
                return value
        raise EncodingError(
            f"malformed delta-encoded id {index} at offset {start}: longer than 10 bytes"
        )


def decode_step(data: bytes) -> StepReport:
    """Decode (and check, like the server) one ``DPLS`` payload."""
    data = bytes(data)
    r = _Reader(data)
    if data[:4] != MAGIC[: min(4, len(data))]:
        found = data[:4].hex(" ") or "nothing"
        raise EncodingError(f'not a step payload: expected magic bytes "DPLS", found {found}')
    r.take(4, "magic")
    (version,) = r.unpack("<B", "version")
    if version != VERSION:
        raise EncodingError(
            f"unsupported step payload version {version}: this client reads version {VERSION}"
        )
    (flags,) = r.unpack("<B", "flags")
    if flags & ~KNOWN_FLAGS:
        raise EncodingError(f"step payload has unknown flag bits {flags & ~KNOWN_FLAGS:#04x}")
    (step,) = r.unpack("<Q", "step")
    part = None
    if flags & FLAG_PART:
        index, count = r.unpack("<II", "part")
        part = Part(index=index, count=count)
    noise = r.unpack("<d", "noise_multiplier")[0] if flags & FLAG_NOISE else None
    rate = r.unpack("<d", "sampling_rate")[0] if flags & FLAG_RATE else None
    n_ids, n_norms = r.unpack("<QQ", "counts")
    delta = bool(flags & FLAG_DELTA_IDS)
    needed = n_ids * (1 if delta else 8) + n_norms * 8 + 4
    if needed > r.remaining():
        raise EncodingError(
            f"step payload declares {n_ids} ids and {n_norms} norms, which need at least "
            f"{needed} bytes, but only {r.remaining()} remain"
        )
    ids: List[int]
    if delta:
        ids = []
        previous = 0
        for index in range(n_ids):
            value = r.varint(index)
            if index == 0:
                current = value
            elif value == 0:
                raise EncodingError(
                    f"malformed delta-encoded id {index}: gap of 0 (ids must be strictly increasing)"
                )
            else:
                current = previous + value
                if current > _U64_MAX:
                    raise EncodingError(f"malformed delta-encoded id {index}: exceeds u64")
            ids.append(current)
            previous = current
    else:
        ids = list(r.unpack(f"<{n_ids}Q", "ids"))
    norms = list(r.unpack(f"<{n_norms}d", "norms"))
    body_end = r.pos
    extra = r.remaining()
    if extra < 4:
        raise EncodingError(f"step payload truncated: crc32 trailer at offset {body_end}")
    if extra > 4:
        raise EncodingError(
            f"step payload has {extra - 4} unexpected bytes after the norms (offset {body_end})"
        )
    (stored,) = r.unpack("<I", "crc32")
    computed = zlib.crc32(data[:body_end]) & 0xFFFFFFFF
    if stored != computed:
        raise EncodingError(
            f"step payload checksum mismatch: trailer says {stored:#010x}, content has {computed:#010x}"
        )
    return StepReport(
        step=step, ids=ids, norms=norms, noise_multiplier=noise, sampling_rate=rate, part=part
    )
