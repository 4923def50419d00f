"""In the cache's process: the recorder the cache records into, the compact encoding of what it
records, telemetry's own drop counters and the drain thread that ships batches to the sinks."""
