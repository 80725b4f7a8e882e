"""The vocabulary every layer speaks: error codes and the exception hierarchy, value
types, settings and structured logs. No I/O."""
