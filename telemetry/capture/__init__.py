"""Capture around a failure: the keyframed flight recorder, the crash window, the failure
record, the replay check and crash bundles (written in the cache's process)."""
