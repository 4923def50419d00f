"""Shared test kits: cache drivers, telemetry rigs, UI snapshots and stores."""
