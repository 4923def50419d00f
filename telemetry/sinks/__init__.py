"""The outputs of the event stream: the ``Sink`` protocol and registry (``base``), the fan-out
(spans, metrics, the journal replica, the store, registered sinks), the OTel exporters and
processors, and the writer process with its transport (where the sinks run)."""
