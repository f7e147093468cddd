"""The binary step encoding: the byte layout of crates/dpledger-api/src/codec.rs, round trips,
defensive decoding, and agreement with the server (the same step reported as
JSON and as binary gives the same ledger, bit for bit)."""

from __future__ import annotations

import math
import random
import struct
import zlib

import pytest

from dpledger import BadRequest, Client, Conflict, EncodingError, decode_step, encode_step
from dpledger.encoding import FLAG_DELTA_IDS

from conftest import poisson_config


def test_layout_byte_by_byte():
    data = encode_step(7, [3, 1], [0.5, 2.0], part=(1, 2), noise_multiplier=1.5, sampling_rate=0.25)
    expected = (
        b"DPLS"
        + bytes([1, 0b0111])
        + struct.pack("<Q", 7)
        + struct.pack("<II", 1, 2)
        + struct.pack("<d", 1.5)
        + struct.pack("<d", 0.25)
        + struct.pack("<QQ", 2, 2)
        + struct.pack("<QQ", 3, 1)
        + struct.pack("<dd", 0.5, 2.0)
    )
    assert data == expected + struct.pack("<I", zlib.crc32(expected))


def test_delta_encoding_is_chosen_like_the_server():
    # Strictly increasing ids with small gaps: LEB128 varints (first id, gaps).
    data = encode_step(0, [5, 300, 301], [1.0, 1.0, 1.0])
    assert data[5] == FLAG_DELTA_IDS
    header = 4 + 2 + 8 + 16
    assert data[header : header + 4] == bytes([5, 0xA7, 0x02, 1])  # 5, gap 295, gap 1
    # Not increasing: 8 bytes per id.
    assert encode_step(0, [301, 300], [1.0, 1.0])[5] == 0
    # Forced either way.
    assert encode_step(0, [1, 2], [1.0, 1.0], delta_ids=False)[5] == 0
    with pytest.raises(ValueError):
        encode_step(0, [2, 1], [1.0, 1.0], delta_ids=True)
    # Huge gaps would cost more than 8 bytes each: raw.
    assert encode_step(0, [2**62, 2**63, 2**64 - 1], [1.0] * 3)[5] == 0  # 27 > 24 bytes
    assert encode_step(0, [0, 2**63], [1.0, 1.0])[5] == FLAG_DELTA_IDS  # 11 < 16 bytes


def test_round_trip_random_reports():
    rng = random.Random(1)
    for _ in range(300):
        n = rng.randrange(0, 50)
        ids = rng.sample(range(0, 10 ** rng.randrange(2, 19)), n) if n else []
        if rng.random() < 0.5:
            ids.sort()
        norms = [rng.choice([0.0, -0.0, 1e-300, rng.random() * 10, math.inf, math.nan]) for _ in ids]
        part = (rng.randrange(3), 3) if rng.random() < 0.3 else None
        sigma = rng.random() + 0.5 if rng.random() < 0.3 else None
        rate = rng.random() if rng.random() < 0.3 else None
        step = rng.randrange(2**64)
        data = encode_step(step, ids, norms, part=part, noise_multiplier=sigma, sampling_rate=rate)
        back = decode_step(data)
        assert back.step == step and back.ids == ids
        assert [struct.pack("<d", g) for g in back.norms] == [struct.pack("<d", g) for g in norms]
        assert (back.part.index, back.part.count) == part if part else back.part is None
        assert back.noise_multiplier == sigma and back.sampling_rate == rate
        assert encode_step(step, back.ids, back.norms, part=part, noise_multiplier=sigma, sampling_rate=rate) == data


def test_nan_payload_and_negative_zero_survive():
    weird = struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_DEAD_BEEF))[0]
    back = decode_step(encode_step(0, [0, 1], [weird, -0.0]))
    assert struct.pack("<d", back.norms[0]) == struct.pack("<d", weird)
    assert math.copysign(1.0, back.norms[1]) == -1.0


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda b: b"XPLS" + b[4:], "magic"),
        (lambda b: b[:4] + b"\x02" + b[5:], "version"),
        (lambda b: b[:5] + b"\x10" + b[6:], "flag"),
        (lambda b: b[:10], "truncated"),
        (lambda b: b[:-5], "declares"),
        (lambda b: b[:-4] + b"\x00" + b[-4:], "unexpected bytes"),
        (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "checksum"),
        (lambda b: b[:14] + struct.pack("<Q", 2**60) + b[22:], "declares"),
        (lambda b: b"", "magic"),
    ],
)
def test_decode_rejects_damaged_payloads(mutate, message):
    good = encode_step(3, [4, 1], [0.5, 0.25])
    with pytest.raises(EncodingError, match=message):
        decode_step(mutate(good))


def test_decode_rejects_bad_varints():
    def payload(id_bytes: bytes, n: int) -> bytes:
        body = b"DPLS" + bytes([1, FLAG_DELTA_IDS]) + struct.pack("<QQQ", 0, n, n) + id_bytes + b"\x00" * 8 * n
        return body + struct.pack("<I", zlib.crc32(body))

    assert decode_step(payload(bytes([2, 3]), 2)).ids == [2, 5]
    with pytest.raises(EncodingError, match="gap of 0"):
        decode_step(payload(bytes([2, 0]), 2))
    with pytest.raises(EncodingError, match="zero group"):
        decode_step(payload(bytes([0x82, 0x00, 1]), 2))


def test_server_refuses_what_the_decoder_refuses(server, admin: Client, new_id):
    """The server checks the same things: a damaged CRC is a 400 naming it."""
    ds = new_id()
    admin.create_dataset(ds, poisson_config(10))
    good = encode_step(0, [1, 2], [0.5, 0.5])
    bad = good[:-1] + bytes([good[-1] ^ 0xFF])
    with pytest.raises(EncodingError):
        decode_step(bad)
    r = admin._http.post(
        f"/v1/datasets/{ds}/steps",
        content=bad,
        headers={"Authorization": f"Bearer {admin.token}", "Content-Type": "application/octet-stream"},
    )
    assert r.status_code == 400
    assert r.headers["content-type"].startswith("application/problem+json")
    assert "checksum mismatch" in r.json()["detail"]
    # Nothing was applied: step 0 is still next.
    assert admin.thresholds(ds).next_step == 0


def test_json_and_binary_reports_give_identical_ledgers(server, admin: Client, new_id):
    """The same 40 steps reported as JSON to one dataset and in the binary
    encoding (raw and delta ids) to another: every example's RDP vector, epsilon
    and threshold are equal bit for bit, and so is the worst case."""
    n, rng = 50, random.Random(7)
    a, b = new_id("json"), new_id("binary")
    for ds in (a, b):
        admin.create_dataset(ds, poisson_config(n, q=0.2, sigma=0.9))
    for t in range(40):
        ids = [i for i in range(n) if rng.random() < 0.2]
        if t % 2:
            rng.shuffle(ids)  # raw u64 ids; sorted ones are delta-encoded
        norms = [rng.choice([rng.random() * 2, 0.0, 1.0, 0.37]) for _ in ids]
        sigma = 1.3 if t % 10 == 9 else None
        oa = admin.report_step(a, t, ids, norms, noise_multiplier=sigma, binary=False)
        ob = admin.report_step(b, t, ids, norms, noise_multiplier=sigma, binary=True)
        assert oa == ob
        assert not oa.duplicate and oa.complete
    for i in range(n):
        pa, pb = admin.example_privacy(a, i), admin.example_privacy(b, i)
        assert pa.example == pb.example
        assert pa.worst_case == pb.worst_case
    assert admin.thresholds(a) == admin.thresholds(b)
    # Some examples are below the worst case (the comparison is not vacuous).
    eps = [admin.example_privacy(a, i).example.rdp_epsilon for i in range(n)]
    assert min(eps) < admin.worst_case(a).epsilon


def test_binary_with_part_and_overrides_is_understood(server, admin: Client, new_id):
    ds, orders = new_id(), [1.5, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]
    admin.create_dataset(ds, poisson_config(10, q=0.3, orders=orders))
    first = admin.report_step(ds, 0, [1, 2], [0.2, 0.3], part=(0, 2), sampling_rate=0.5)
    assert not first.complete and first.part is not None and first.part.count == 2
    # The server read the override from the binary body: a part without it disagrees.
    with pytest.raises(Conflict, match="same noise_multiplier and sampling_rate"):
        admin.report_step(ds, 0, [7], [5.0], part=(1, 2))
    second = admin.report_step(ds, 0, [7], [5.0], part=(1, 2), sampling_rate=0.5)
    assert second.complete and second.thresholds == [1.0]
    # The step was charged at q = 0.5, not the dataset's 0.3.
    want = admin.accountant_epsilon(0.5, 1.0, 1, 1e-5, orders=orders, method="rdp").epsilon
    assert admin.worst_case(ds).rdp.epsilon == pytest.approx(want, rel=1e-12)
    assert want > admin.accountant_epsilon(0.3, 1.0, 1, 1e-5, orders=orders, method="rdp").epsilon
    # Bad values in a binary body are refused like JSON ones, naming the field.
    with pytest.raises(BadRequest) as bad:
        admin.report_step(ds, 1, [1], [math.nan])
    assert bad.value.field == "norms"
