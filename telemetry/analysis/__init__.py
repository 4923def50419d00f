"""Reading a store or a bundle after the fact: loaders for notebooks, post-mortem questions, the
miss explainer (``miss/``) and the budget doctor. Reads ``telemetry.store.schema`` only, never the live
pipeline."""
