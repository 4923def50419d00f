"""The embedded store (one SQLite file in WAL mode): schema, the single writer's appends, the
read-only reader, the bundle format and the Perfetto export. Plain data: no live pipeline."""
