"""radixscope engine: a reference continuous-batching serving loop that drives the cache as a
serving engine does (``engine.engine``), a deterministic stand-in model whose KV content is a
function of the token prefix (``engine.model``), seeded workloads (``engine.workloads``) and the
``radixscope`` CLI (``engine.cli``)."""
