"""The native parts (``cache/_native.c``: the cache's kernels; ``cache/_ledger.c``: its per-op
bookkeeping of recording; ``cache/_leafheap.c``: FULL's evictable leaves in LRU order;
``telemetry/record/_sink.c``: the recorder's per-op encoder); everything else is in
pyproject.toml.

``optional``: where no C compiler is found the build warns and the project runs on their
pure-Python versions (``cache/native.py``, ``cache/ledger.py``, ``cache/leaves.py``,
``telemetry/record/sink.py``)."""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("radixscope.cache._native", ["cache/_native.c"],
              depends=["cache/_builders.h", "cache/_slots.h"], optional=True),
    Extension("radixscope.cache._ledger", ["cache/_ledger.c"],
              depends=["cache/_builders.h", "cache/_direct.h", "cache/_slots.h"], optional=True),
    Extension("radixscope.cache._leafheap", ["cache/_leafheap.c"], optional=True),
    Extension("radixscope.telemetry.record._sink", ["telemetry/record/_sink.c"],
              depends=["cache/_direct.h"], optional=True),
])
