"""Structured logging: one JSON object per line, or a readable key=value line.

Extra fields come from `logger.info("msg", extra={...})`. `configure_logging` replaces only the
handler it installed earlier, so handlers added by others (pytest's caplog) keep working.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

__all__ = ["JsonFormatter", "TextFormatter", "configure_logging"]

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("x", logging.INFO, "x", 0, "x", None, None))) | {
    "message",
    "asctime",
    "taskName",
}
_MARK = "_zonefleet_handler"


def _iso_utc(created: float) -> str:
    return datetime.fromtimestamp(created, tz=UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS}


def _exc_text(formatter: logging.Formatter, record: logging.LogRecord) -> str | None:
    parts = []
    if record.exc_info:
        parts.append(formatter.formatException(record.exc_info))
    if record.stack_info:
        parts.append(formatter.formatStack(record.stack_info))
    return "\n".join(parts) or None


class JsonFormatter(logging.Formatter):
    """ts, level, logger, node, msg, then extras (and exc when there is a traceback)."""

    def __init__(self, node: str | None = None) -> None:
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, Any] = {
            "ts": _iso_utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "node": self.node,
            "msg": record.getMessage(),
        }
        for key, value in _extras(record).items():
            obj.setdefault(key, value)
        exc = _exc_text(self, record)
        if exc:
            obj["exc"] = exc
        return json.dumps(obj, default=str, ensure_ascii=False)


def _text_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text == "" or any(c.isspace() or c in '"=' for c in text):
        return json.dumps(text, ensure_ascii=False)
    return text


class TextFormatter(logging.Formatter):
    """`<ts> <LEVEL> <logger> [node] <msg> key=value ...` on one line (tracebacks follow)."""

    def __init__(self, node: str | None = None) -> None:
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        parts = [_iso_utc(record.created), f"{record.levelname:<7}", record.name]
        if self.node:
            parts.append(f"[{self.node}]")
        parts.append(record.getMessage().replace("\n", "\\n"))
        parts.extend(f"{k}={_text_value(v)}" for k, v in _extras(record).items())
        line = " ".join(parts)
        exc = _exc_text(self, record)
        return f"{line}\n{exc}" if exc else line


def configure_logging(
    level: str = "INFO",
    fmt: Literal["json", "text"] = "text",
    node: str | None = None,
    *,
    stream: TextIO | None = None,
) -> logging.Handler:
    """Configure the root logger; returns the installed handler (writing to stderr by default)."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    if fmt == "json":
        formatter: logging.Formatter = JsonFormatter(node)
    elif fmt == "text":
        formatter = TextFormatter(node)
    else:
        raise ValueError(f"unknown log format {fmt!r}")
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _MARK, False)]:
        root.removeHandler(old)
        old.close()
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter)
    setattr(handler, _MARK, True)
    root.addHandler(handler)
    root.setLevel(numeric)
    return handler
