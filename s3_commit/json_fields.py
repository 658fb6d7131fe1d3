"""Field checks for the JSON documents kept in the object store (manifests, node
registrations, the controller lease): each names the field and raises the document's own
format error, so a reader reports what is wrong and where."""

from __future__ import annotations

from typing import Any

__all__ = ["expect_int", "expect_str"]


def expect_int(value: Any, where: str, error: type[ValueError]) -> int:
    # bool is an int subclass, but true/false is never a valid count, offset or id.
    if not isinstance(value, int) or isinstance(value, bool):
        raise error(f"{where}: expected an integer, got {value!r}")
    return value


def expect_str(value: Any, where: str, error: type[ValueError]) -> str:
    if not isinstance(value, str):
        raise error(f"{where}: expected a string, got {value!r}")
    return value
