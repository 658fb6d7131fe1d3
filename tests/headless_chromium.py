"""Debian's headless Chromium driven over the DevTools protocol on a pipe, for tests of pages
a person reads (the HTML cost report).

``--remote-debugging-pipe`` makes Chromium read protocol commands from fd 3 and write answers
and events to fd 4, each message JSON ended by a NUL byte: no port, no websocket library, no
downloaded browser. A reader thread collects every message; callers wait on a condition for
the answer or event they need, with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--hide-scrollbars",
    "--mute-audio",
)
Message = dict[str, Any]


class ChromiumUnavailable(RuntimeError):
    """Chromium is not installed, or it did not start (the message has its stderr's tail)."""


class CdpError(RuntimeError):
    """A DevTools command answered with an error."""


class Chromium:
    """One browser process and its protocol pipe."""

    def __init__(self, proc: subprocess.Popen[bytes], to_browser: int, from_browser: int):
        self._proc = proc
        self._out = to_browser
        self._in = from_browser
        self._cond = threading.Condition()
        self._answers: dict[int, Message] = {}
        self.events: list[Message] = []
        self._closed = False
        self._next_id = 0
        self._reader = threading.Thread(target=self._read, name="chromium-cdp", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._in, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._cond:
                    self._closed = True
                    self._cond.notify_all()
                return
            buf += chunk
            *messages, buf = buf.split(b"\0")
            with self._cond:
                for raw in messages:
                    msg = json.loads(raw)
                    if "id" in msg:
                        self._answers[msg["id"]] = msg
                    else:
                        self.events.append(msg)
                self._cond.notify_all()

    def _wait(self, ready: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = ready()
                if found is not None:
                    return found
                if self._closed:
                    raise ChromiumUnavailable(f"chromium closed its pipe while waiting for {what}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no {what} from chromium within {timeout} s")
                self._cond.wait(left)

    def call(
        self,
        method: str,
        params: Message | None = None,
        session: str | None = None,
        timeout: float = 60.0,
    ) -> Message:
        with self._cond:
            self._next_id += 1
            msg_id = self._next_id
        msg: Message = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        data = json.dumps(msg).encode() + b"\0"
        try:
            while data:
                data = data[os.write(self._out, data) :]
        except BrokenPipeError as exc:
            raise ChromiumUnavailable(f"chromium closed its pipe before {method}") from exc
        answer: Message = self._wait(lambda: self._answers.pop(msg_id, None), timeout, method)
        if "error" in answer:
            raise CdpError(f"{method}: {answer['error']}")
        return dict(answer.get("result", {}))

    def wait_event(
        self, method: str, session: str | None, since: int, timeout: float = 60.0
    ) -> Message:
        """The first `method` event of `session` at index `since` or later in `events`."""

        def find() -> Message | None:
            for ev in self.events[since:]:
                if ev.get("method") == method and ev.get("sessionId") == session:
                    return ev
            return None

        found: Message = self._wait(find, timeout, method)
        return found

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except (CdpError, ChromiumUnavailable, TimeoutError, OSError):
            pass
        try:
            self._proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=15)
        for fd in (self._out, self._in):
            try:
                os.close(fd)
            except OSError:
                pass


def _high_fd(fd: int) -> int:
    """`fd` moved to 10 or above, clear of the 3 and 4 it is placed on in the child."""
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


@contextmanager
def launch(binary: str = CHROMIUM, start_timeout: float = 60.0) -> Iterator[Chromium]:
    """A headless Chromium with a fresh profile, closed (and its profile removed) on exit."""
    if not shutil.which(binary):
        raise ChromiumUnavailable(f"{binary} is not installed (Debian package 'chromium')")
    profile = Path(tempfile.mkdtemp(prefix="zonefleet-chromium-"))
    cmd_r, cmd_w = os.pipe()
    out_r, out_w = os.pipe()
    cmd_r, out_w = _high_fd(cmd_r), _high_fd(out_w)
    # Chromium wants the pipe on fds 3 and 4: bash places it there and execs the browser (dash
    # cannot name fds above 9; the fd numbers are ours, nothing from outside is in the command).
    place = f'exec "$@" 3<&{cmd_r} 4>&{out_w} {cmd_r}<&- {out_w}>&-'
    args = [binary, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank"]
    stderr = open(profile / "stderr.log", "wb")  # closed below
    try:
        proc = subprocess.Popen(
            ["/bin/bash", "-c", place, "bash", *args],
            stdin=subprocess.DEVNULL,
            stdout=stderr,
            stderr=stderr,
            pass_fds=(cmd_r, out_w),
        )
    except OSError as exc:
        stderr.close()
        shutil.rmtree(profile, ignore_errors=True)
        raise ChromiumUnavailable(f"cannot run {binary}: {exc}") from exc
    finally:
        os.close(cmd_r)
        os.close(out_w)
    browser = Chromium(proc, cmd_w, out_r)
    try:
        try:
            browser.call("Browser.getVersion", timeout=start_timeout)
        except (ChromiumUnavailable, TimeoutError) as exc:
            browser.close()
            stderr.flush()
            tail = (profile / "stderr.log").read_text(errors="replace")[-2000:]
            raise ChromiumUnavailable(f"chromium did not start: {exc}\n{tail}") from exc
        yield browser
    finally:
        browser.close()
        stderr.close()
        shutil.rmtree(profile, ignore_errors=True)


@dataclass
class PageReport:
    """What a page did once loaded: its evaluated `probe`, errors, and the requests it made."""

    probe: Any
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    content_height: float = 0.0


def _error_text(ev: Message) -> str | None:
    method, p = ev.get("method"), ev.get("params", {})
    if method == "Runtime.exceptionThrown":
        d = p.get("exceptionDetails", {})
        return f"exception: {d.get('exception', {}).get('description') or d.get('text')}"
    if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
        args = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
        return f"console.{p.get('type')}: {args}"
    if method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
        e = p["entry"]
        return f"log ({e.get('source')}): {e.get('text')} {e.get('url', '')}".strip()
    return None


def open_page(
    browser: Chromium,
    url: str,
    probe_js: str,
    width: int = 1280,
    height: int = 900,
    screenshot: Path | None = None,
) -> PageReport:
    """Open `url` in a new tab `width` CSS pixels wide, wait for its load event, evaluate
    `probe_js` (an expression giving JSON-able data) and keep a full-page PNG if asked."""
    target = browser.call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = browser.call("Target.attachToTarget", {"targetId": target, "flatten": True})
    sid = session["sessionId"]
    start = len(browser.events)
    try:
        for domain in ("Page", "Runtime", "Log", "Network"):
            browser.call(f"{domain}.enable", session=sid)
        browser.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session=sid,
        )
        before = len(browser.events)
        nav = browser.call("Page.navigate", {"url": url}, session=sid)
        if nav.get("errorText"):
            raise CdpError(f"navigate to {url}: {nav['errorText']}")
        browser.wait_event("Page.loadEventFired", sid, before)
        browser.call(
            "Runtime.evaluate",
            {"expression": "document.fonts.ready.then(() => true)", "awaitPromise": True},
            session=sid,
        )
        result = browser.call(
            "Runtime.evaluate", {"expression": probe_js, "returnByValue": True}, session=sid
        )
        if "exceptionDetails" in result:
            raise CdpError(f"probe failed: {result['exceptionDetails']}")
        metrics = browser.call("Page.getLayoutMetrics", session=sid)
        size = metrics.get("cssContentSize") or metrics.get("contentSize") or {}
        content_h = float(size["height"])
        if screenshot is not None:
            shot = browser.call(
                "Page.captureScreenshot",
                {
                    "format": "png",
                    "captureBeyondViewport": True,
                    "clip": {"x": 0, "y": 0, "width": width, "height": content_h, "scale": 1},
                },
                session=sid,
            )
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            screenshot.write_bytes(base64.b64decode(shot["data"]))
        # Events arrive in order on the pipe: every error logged while the page loaded and ran
        # came before the answers above.
        mine = [ev for ev in browser.events[start:] if ev.get("sessionId") == sid]
        errors = [e for e in map(_error_text, mine) if e]
        requests = [
            ev["params"]["request"]["url"]
            for ev in mine
            if ev.get("method") == "Network.requestWillBeSent"
        ]
        return PageReport(result["result"].get("value"), errors, requests, content_h)
    finally:
        browser.call("Target.closeTarget", {"targetId": target})
