"""kcat from Debian (librdkafka 2.0.2, older than the wheels) against `zonefleet up`."""

from __future__ import annotations

import shutil
import subprocess
import uuid

import pytest

from tests.fleet_process import FleetProcess
from tests.test_e2e_clients import create_topic

KCAT = shutil.which("kcat")
pytestmark = pytest.mark.skipif(
    KCAT is None, reason="kcat is not installed (make test installs it)"
)


def _kcat(*args: str, stdin: str | None = None, timeout: float = 30) -> str:
    assert KCAT is not None
    done = subprocess.run(
        [KCAT, *args], input=stdin, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"kcat {args} failed: {done.stderr}"
    return done.stdout


def test_kcat_version_is_old() -> None:
    out = subprocess.run([KCAT or "kcat", "-V"], capture_output=True, text=True).stdout
    assert "librdkafka" in out


def test_kcat_produce_consume_and_query(fleet: FleetProcess) -> None:
    topic = f"kcat-{uuid.uuid4().hex[:8]}"
    create_topic(fleet.bootstrap, topic, partitions=1)
    lines = [f"line-{i}" for i in range(100)]
    _kcat("-b", fleet.bootstrap, "-t", topic, "-P", "-p", "0", stdin="\n".join(lines) + "\n")
    out = _kcat("-b", fleet.bootstrap, "-t", topic, "-C", "-e", "-o", "beginning")
    assert out.splitlines() == lines
    # -Q with a timestamp far in the past gives the first offset; -1 (end) gives the end.
    start = _kcat("-b", fleet.bootstrap, "-Q", "-t", f"{topic}:0:0")
    assert f"{topic} [0] offset 0" in start
    end = _kcat("-b", fleet.bootstrap, "-Q", "-t", f"{topic}:0:-1")
    assert f"{topic} [0] offset 100" in end
    meta = _kcat("-b", fleet.bootstrap, "-L", "-t", topic)
    assert f'topic "{topic}" with 1 partitions' in meta
