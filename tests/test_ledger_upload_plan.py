"""The pure planning of ledger uploads (telemetry/ledger_upload.py): keys, ranges, cursor."""

from __future__ import annotations

import pytest

from cost_report.ledger_files import parse_ledger_path, plan_files
from telemetry.ledger_upload import (
    CursorError,
    LedgerRange,
    UploadCursor,
    complete_range,
    cursor_relpath,
    ledger_key,
    ledger_relpath,
    parse_ledger_key,
    parse_ledger_relpath,
    pending_files,
)

DAY = "2026-11-22"
LINE_A = b'{"minute":"2026-11-22T10:30:00Z","bytes":1}\n'
LINE_B = b'{"minute":"2026-11-22T10:31:00Z","bytes":2}\n'
TORN = b'{"minute":"2026-11-22T10:3'


def test_key_golden_and_round_trip() -> None:
    key = ledger_key(DAY, "proxy-102", 1300)
    assert key == "accounting/dt=2026-11-22/proxy-102.000000001300.jsonl"
    assert parse_ledger_key(key) == (DAY, "proxy-102", 1300)
    for node, start in [("main-1", 0), ("proxy_7", 10**12 - 1), ("m", 45)]:
        assert parse_ledger_key(ledger_key(DAY, node, start)) == (DAY, node, start)
    # The report reads the same name as the same range of the same node-day.
    parsed = parse_ledger_path(key, 700)
    assert parsed is not None
    assert (parsed.dt, parsed.node, parsed.start, parsed.end) == (DAY, "proxy-102", 1300, 2000)
    assert LedgerRange(DAY, "proxy-102", 1300, 2000).key == key


@pytest.mark.parametrize(
    "key",
    [
        "accounting/dt=2026-11-22/proxy-102.jsonl",  # a local file's name, not an upload
        "accounting/dt=2026-11-22/proxy-102.00000001300.jsonl",  # 11 digits
        "accounting/dt=2026-11-22/proxy.102.000000001300.jsonl",  # a dot in the node
        "accounting/dt=2026-11-2/proxy-102.000000001300.jsonl",
        "accounting/_upload/proxy-102.json",
        "data/sso/00000000000000000000000000000001",
        "prefix/accounting/dt=2026-11-22/proxy-102.000000001300.jsonl",
        "accounting/dt=2026-11-22/proxy-102.000000001300.jsonl.tmp",
    ],
)
def test_parse_refuses_other_keys(key: str) -> None:
    assert parse_ledger_key(key) is None


def test_names_refuse_what_would_not_parse_back() -> None:
    with pytest.raises(ValueError, match="node name"):
        ledger_key(DAY, "proxy.102", 0)
    with pytest.raises(ValueError, match="day"):
        ledger_key("2026-1-22", "main-1", 0)
    with pytest.raises(ValueError, match="12 digits"):
        ledger_key(DAY, "main-1", 10**12)
    with pytest.raises(ValueError, match="12 digits"):
        ledger_key(DAY, "main-1", -1)
    assert ledger_relpath(DAY, "main-1") == "dt=2026-11-22/main-1.jsonl"
    assert parse_ledger_relpath("dt=2026-11-22/main-1.jsonl") == (DAY, "main-1")
    assert parse_ledger_relpath("dt=2026-11-22/main-1.000000000000.jsonl") is None
    assert cursor_relpath("main-1") == "_upload/main-1.json"


def test_ranges_end_after_the_last_newline() -> None:
    data = LINE_A + LINE_B
    whole = complete_range(DAY, "main-1", 0, data)
    assert whole == LedgerRange(DAY, "main-1", 0, len(data))
    # From the cursor on: the window is the file's bytes from there.
    rest = complete_range(DAY, "main-1", len(LINE_A), data[len(LINE_A) :])
    assert rest == LedgerRange(DAY, "main-1", len(LINE_A), len(data))
    assert rest.key == ledger_key(DAY, "main-1", len(LINE_A))
    assert rest.size == len(LINE_B)


def test_torn_tail_is_not_uploaded() -> None:
    data = LINE_A + TORN
    part = complete_range(DAY, "main-1", 0, data)
    assert part is not None and part.end == len(LINE_A)
    assert data[: part.size] == LINE_A
    # Nothing but the torn line past the cursor: nothing to upload yet.
    assert complete_range(DAY, "main-1", len(LINE_A), TORN) is None
    # The next append closes the torn line with a newline (traffic_sink): then it goes up,
    # as its own line, which readers skip as bad.
    closed = TORN + b"\n" + LINE_B
    later = complete_range(DAY, "main-1", len(LINE_A), closed)
    assert later is not None and later.end == len(data) + 1 + len(LINE_B)


def test_crash_between_put_and_cursor_reputs_the_same_key_with_a_superset() -> None:
    """The cursor moves only after a put: a crash in between plans the same start again,
    so the re-put has the same key and more bytes, and the report counts each byte once."""
    cursor = UploadCursor("main-1")
    relpath = ledger_relpath(DAY, "main-1")
    file = LINE_A
    pending, _ = pending_files("main-1", cursor.uploaded, {relpath: len(file)})
    assert pending == [(relpath, 0)]
    first = complete_range(DAY, "main-1", 0, file)
    assert first is not None
    # put(first) ... crash: the cursor was not written. The node restarts and appends.
    file += LINE_B
    pending, _ = pending_files("main-1", cursor.uploaded, {relpath: len(file)})
    assert pending == [(relpath, 0)]
    again = complete_range(DAY, "main-1", 0, file)
    assert again is not None
    assert again.key == first.key and again.start == first.start and again.end > first.end
    # Whether the store kept the first or the second put, the report keeps one range.
    for stored in (first, again):
        plan = plan_files([(stored.key, stored.size), (f"dt={DAY}/main-1.jsonl", len(file))])
        assert [(f.start, f.end) for f in plan.kept] == [(0, len(file))]
        assert len(plan.duplicates) == 1 and not plan.rejected
    # After the put and the cursor write, the next range starts where this one ended.
    cursor.uploaded[relpath] = again.end
    file += LINE_A
    pending, _ = pending_files("main-1", cursor.uploaded, {relpath: len(file)})
    assert pending == [(relpath, again.end)]
    nxt = complete_range(DAY, "main-1", again.end, file[again.end :])
    assert nxt is not None and nxt.key == ledger_key(DAY, "main-1", again.end)
    plan = plan_files([(again.key, again.size), (nxt.key, nxt.size)])
    assert [f.start for f in plan.kept] == [0, again.end] and not plan.duplicates


def test_pending_files_only_the_nodes_own_oldest_day_first() -> None:
    sizes = {
        "dt=2026-11-23/main-1.jsonl": 50,
        "dt=2026-11-22/main-1.jsonl": 100,
        "dt=2026-11-21/main-1.jsonl": 10,  # all uploaded
        "dt=2026-11-20/main-1.jsonl": 5,  # shorter than uploaded: replaced
        "dt=2026-11-22/proxy-102.jsonl": 70,  # another node's (a shared data_dir)
        "dt=2026-11-22/main-10.jsonl": 70,
        "dt=2026-11-22/notes.txt": 3,
    }
    uploaded = {
        "dt=2026-11-22/main-1.jsonl": 40,
        "dt=2026-11-21/main-1.jsonl": 10,
        "dt=2026-11-20/main-1.jsonl": 9,
    }
    pending, shrunk = pending_files("main-1", uploaded, sizes)
    assert pending == [("dt=2026-11-22/main-1.jsonl", 40), ("dt=2026-11-23/main-1.jsonl", 0)]
    assert shrunk == ["dt=2026-11-20/main-1.jsonl"]


def test_cursor_golden_round_trip_and_prune() -> None:
    cursor = UploadCursor(
        "proxy-102",
        {"dt=2026-11-23/proxy-102.jsonl": 90, "dt=2026-11-22/proxy-102.jsonl": 2000},
    )
    golden = (
        b'{"format":1,"node":"proxy-102","uploaded":{"dt=2026-11-22/proxy-102.jsonl":2000,'
        b'"dt=2026-11-23/proxy-102.jsonl":90}}\n'
    )
    assert cursor.encode() == golden
    assert UploadCursor.decode(golden, "proxy-102") == cursor
    assert not cursor.prune(["dt=2026-11-22/proxy-102.jsonl", "dt=2026-11-23/proxy-102.jsonl"])
    assert cursor.prune(["dt=2026-11-23/proxy-102.jsonl"])
    assert cursor.uploaded == {"dt=2026-11-23/proxy-102.jsonl": 90}


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b'{"format":1,"node":"proxy-1', "not JSON"),
        (b'{"format":2,"node":"proxy-102","uploaded":{}}', "format-1"),
        (b'{"format":1,"node":"main-1","uploaded":{}}', "main-1"),
        (b'{"format":1,"node":"proxy-102","uploaded":[]}', "not an object"),
        (b'{"format":1,"node":"proxy-102","uploaded":{"dt=2026-11-22/main-1.jsonl":5}}', "not a"),
        (
            b'{"format":1,"node":"proxy-102","uploaded":{"dt=2026-11-22/proxy-102.jsonl":-5}}',
            "offset",
        ),
        (
            b'{"format":1,"node":"proxy-102","uploaded":{"dt=2026-11-22/proxy-102.jsonl":true}}',
            "offset",
        ),
    ],
)
def test_bad_cursor_is_refused_with_the_reason(data: bytes, reason: str) -> None:
    with pytest.raises(CursorError, match=reason):
        UploadCursor.decode(data, "proxy-102")
