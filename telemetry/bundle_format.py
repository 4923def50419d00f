"""What makes a SQLite file a crash bundle: its format name, version and the manifest's digests.

Shared by the bundle writer (``telemetry/bundle.py``, in the cache's process) and the loaders
(``telemetry/bundle_reader.py``), so reading a bundle needs nothing from the live pipeline.
"""

from __future__ import annotations

import hashlib
import sqlite3

BUNDLE_FORMAT = "radixscope.bundle"
BUNDLE_VERSION = 1
COUNTED_TABLES = ("ops", "mutations", "keyframes", "metrics", "violations", "events")


def table_digest(con: sqlite3.Connection, table: str) -> str:
    """SHA-256 over a table's rows in rowid order (the ``mutations`` view's in seq order): the
    manifest's guard against damage."""
    h = hashlib.sha256()
    order = "seq" if table == "mutations" else "rowid"
    for row in con.execute(f"SELECT * FROM {table} ORDER BY {order}"):
        h.update(repr(row).encode())
    return h.hexdigest()
