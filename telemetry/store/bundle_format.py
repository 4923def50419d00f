"""What makes a SQLite file a crash bundle: its format name, version and the manifest's digests.

Shared by the bundle writer (``telemetry/capture/bundle.py``, in the cache's process) and the loaders
(``telemetry/analysis/load.py``), so reading a bundle needs nothing from the live pipeline.
"""

from __future__ import annotations

import hashlib
import sqlite3

BUNDLE_FORMAT = "radixscope.bundle"
BUNDLE_VERSION = 4  # 2: the manifest digests the info rows; mutations digested from journal
#                   3: component states per tier (store schema 4)
#                   4: the L3 prefetches pending at bundle time (info row ``prefetches``)
READABLE_VERSIONS = (3, 4)  # a version-3 bundle reads as one with no pending prefetches
COUNTED_TABLES = ("ops", "mutations", "keyframes", "metrics", "violations", "events")
DIGESTED = (*COUNTED_TABLES, "info")


def table_digest(con: sqlite3.Connection, table: str) -> str:
    """SHA-256 over a table's rows in rowid order: the manifest's guard against damage.

    ``mutations`` digests the ``journal`` table it is stored in (a view a file defines is
    never run); ``info`` digests every info row but the manifest (``bundle``) itself, by key,
    so everything the loader trusts is covered."""
    h = hashlib.sha256()
    if table == "info":
        sql = "SELECT key, value FROM info WHERE key != 'bundle' ORDER BY key"
    else:
        sql = f"SELECT * FROM {'journal' if table == 'mutations' else table} ORDER BY rowid"
    for row in con.execute(sql):
        h.update(repr(row).encode())
    return h.hexdigest()


def row_count(con: sqlite3.Connection, table: str) -> int:
    """Rows of a counted table; ``mutations``: the entries of the ``journal`` chunks."""
    if table == "mutations":
        return int(con.execute("SELECT coalesce(sum(json_array_length(data)), 0) FROM journal")
                   .fetchone()[0])
    return int(con.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
