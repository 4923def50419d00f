"""radixscope: an observability-first hierarchical KV prefix cache for LLM serving.

Import names: ``radixscope.cache`` (the cache), ``radixscope.telemetry`` (its event stream ->
spans, metrics, the store, post-mortems), ``radixscope.engine`` (the reference serving loop and
the ``radixscope`` CLI) and ``radixscope.ui`` (the Streamlit app). The repository keeps them as
the top-level folders ``cache/ telemetry/ engine/ ui/``; ``pyproject.toml`` maps them here.
"""
