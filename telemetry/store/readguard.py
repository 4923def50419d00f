"""Argument checks and error translation for the store readers.

A reader's file is untrusted: what a damaged or hostile file makes SQLite or the JSON decoder
raise becomes one ``ValueError`` naming the file (``file_errors``); arguments are checked first,
with a ``TypeError`` / ``ValueError`` naming the argument.
"""

from __future__ import annotations

import functools
import json
import numbers
import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class Malformed(Exception):
    """A row whose content does not have the shape this schema writes."""


FILE_ERRORS = (sqlite3.Error, json.JSONDecodeError, UnicodeDecodeError, RecursionError, Malformed)
"""What a damaged or hostile file makes a read raise."""
_INT64_MAX = 2**63 - 1


def file_errors(fn: F) -> F:
    """Turn what a damaged or hostile file makes SQLite or the JSON decoder raise into one
    ``ValueError`` naming the file (arguments are checked before, with their own errors)."""
    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except FILE_ERRORS as e:
            raise damaged(self.path, fn.__name__, e) from None
    return wrapper  # type: ignore[return-value]


def damaged(path: object, what: str, e: BaseException) -> ValueError:
    """The one error a reader raises for what a file made ``what`` raise (``e``)."""
    return ValueError(f"{str(path)!r} is damaged or not a valid radixscope store: {what}() "
                      f"failed ({type(e).__name__}: {e})")


def int_arg(name: str, v: object, optional: bool = True) -> None:
    if v is None and optional:
        return
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be an int{' or None' if optional else ''}, got {v!r}")
    if not -_INT64_MAX <= int(v) <= _INT64_MAX:
        raise ValueError(f"{name}={v!r} is outside the 64-bit range of seqs and ids")


def str_arg(name: str, v: object) -> None:
    if v is not None and not isinstance(v, str):
        raise TypeError(f"{name} must be a str or None, got {v!r}")


__all__ = ["FILE_ERRORS", "Malformed", "damaged", "file_errors", "int_arg", "str_arg"]
