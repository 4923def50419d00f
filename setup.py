"""The native kernels (``cache/_native.c``); everything else is in pyproject.toml.

``optional``: where no C compiler is found the build warns and the cache runs on the kernels'
pure-Python versions (``cache/native.py``)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("radixscope.cache._native", ["cache/_native.c"], optional=True)])
