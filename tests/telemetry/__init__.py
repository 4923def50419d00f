"""Tests of radixscope.telemetry."""
