"""docs/compatibility.md lists every Kafka API key with exactly the versions the brokers
advertise, and names, for each supported one, test modules that exist and send it."""

from __future__ import annotations

import re
from pathlib import Path

from kafka_wire.codec import KIO_VERSION_RANGES
from main_broker.broker import SUPPORTED_APIS, advertised_versions

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "compatibility.md"
NOT_SUPPORTED = "no"


def _rows() -> dict[int, tuple[str, str, str, str]]:
    rows: dict[int, tuple[str, str, str, str]] = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[0].isdigit():
            continue
        key = int(cells[0])
        assert key not in rows, f"API key {key} is listed twice"
        rows[key] = (cells[1], cells[2], cells[3], cells[4])
    return rows


def test_every_api_key_is_listed_with_the_advertised_versions() -> None:
    rows = _rows()
    assert set(rows) == set(KIO_VERSION_RANGES), "one row per API key of Kafka 4.x"
    advertised = advertised_versions()
    for key, (name, versions, _clients, _tests) in rows.items():
        if key in advertised:
            lo, hi = advertised[key]
            assert name == SUPPORTED_APIS[key][0]
            expected = f"{lo}" if lo == hi else f"{lo}-{hi}"
            assert versions == expected, f"{name}: the doc says {versions}, we advertise {expected}"
        else:
            assert versions == NOT_SUPPORTED, f"API {key} ({name}) is not advertised"


def test_each_supported_api_names_tests_that_exist() -> None:
    for name, versions, clients, tests in _rows().values():
        if versions == NOT_SUPPORTED:
            continue
        assert clients, f"{name}: which client was it tested with?"
        modules = re.findall(r"`(tests/[\w/]+\.py)`", tests)
        assert modules, f"{name}: no test module named"
        for module in modules:
            assert (ROOT / module).is_file(), f"{name}: {module} does not exist"
