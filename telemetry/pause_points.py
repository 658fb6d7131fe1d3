"""Test-only pause points, for crash tests that must kill -9 a node at an exact step.

With ``ZONEFLEET_TEST_PAUSE_AT=<step>`` (or ``<step>:<n>``, the n-th time) in its environment,
a process stops itself (SIGSTOP) when it reaches that step, so a test waiting on the stop
(``waitpid(WUNTRACED)``) can SIGKILL it there: no later line of the step runs. Unset, the
default, a pause point is one comparison.

Steps: ``after_upload`` (objects PUT, their manifest CAS not yet made), ``after_manifest`` (the
manifest CAS succeeded, nothing after it ran), ``during_trim`` (a WAL retention pass deleted a
segment and has more to delete), ``after_compaction_upload`` (a compaction's new objects PUT,
its manifest swap not yet made), ``after_compaction_swap`` (the swap's CAS succeeded, nothing
after it ran), ``after_cleaner_upload`` and ``after_cleaner_swap`` (the same two steps of one
object rewrite of the log cleaner).
"""

from __future__ import annotations

import logging
import os
import signal

__all__ = ["PAUSE_ENV", "pause_point"]

PAUSE_ENV = "ZONEFLEET_TEST_PAUSE_AT"
_STEP, _, _NTH = (os.environ.get(PAUSE_ENV) or "").partition(":")
_left = int(_NTH or 1)

log = logging.getLogger("zonefleet.pause")


def pause_point(step: str) -> None:
    global _left
    if step != _STEP:
        return
    _left -= 1
    if _left == 0:
        log.warning("test pause at %s: stopping pid %d", step, os.getpid())
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGSTOP)
