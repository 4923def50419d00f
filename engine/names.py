"""Names of the engine's request spans and their attributes (OTel naming rules; GenAI semantic
conventions where they fit, ``engine.request.*`` for what they do not cover)."""

from __future__ import annotations

INSTRUMENTATION_SCOPE = "radixscope.engine"
OPERATION = "text_completion"  # gen_ai.operation.name
PROVIDER = "radixscope"  # gen_ai.provider.name

# GenAI semantic conventions (development status)
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
ERROR_TYPE = "error.type"

# joins the request span to the cache's op spans (same key the cache spans carry)
REQUEST_ID = "kv_cache.request.id"

# engine specifics
REQ_WORKLOAD = "engine.request.workload"
REQ_EXTRA_KEY = "engine.request.extra_key"
REQ_QUEUE_STEPS = "engine.request.queue_steps"
REQ_ADMISSION_ATTEMPTS = "engine.request.admission_attempts"
REQ_REFUSAL_REASON = "engine.request.refusal_reason"
REQ_RETRACTIONS = "engine.request.retractions"
REQ_PREFILL_CHUNKS = "engine.request.prefill_chunks"
REQ_DEVICE_HIT_TOKENS = "engine.request.device_hit_tokens"
REQ_HOST_HIT_TOKENS = "engine.request.host_hit_tokens"
REQ_STORAGE_HIT_TOKENS = "engine.request.storage_hit_tokens"  # of the host hit, from L3
REQ_SWA_LOADED_TOKENS = "engine.request.swa_loaded_tokens"
REQ_MAMBA_LOADED_STATES = "engine.request.mamba_loaded_states"

FINISH_LENGTH = "length"
REJECTED = "rejected"


def span_name(model: str) -> str:
    """``{gen_ai.operation.name} {gen_ai.request.model}``, as the GenAI conventions name spans."""
    return f"{OPERATION} {model}"
