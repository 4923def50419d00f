"""Tests of radixscope.ui."""
