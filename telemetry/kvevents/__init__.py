"""KV events in the ecosystem's wire format (vLLM / SGLang / TensorRT-LLM, consumed by Dynamo
and llm-d): ``publisher`` publishes our cache's blocks per tier and group from the sinks' event
stream; ``watch`` subscribes to another engine's events and rebuilds its blocks into a store.
See ``docs/kv-events.md``."""
