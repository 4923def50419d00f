"""Tests of radixscope.engine."""
