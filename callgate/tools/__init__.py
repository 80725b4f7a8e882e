"""The tool model the producer and the worker share: registry, decorator, intent,
the gate, safe results and redaction. No I/O."""
