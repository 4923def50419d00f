"""Tests of radixscope.cache."""
