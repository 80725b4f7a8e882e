"""Micro-benchmarks run by hand: what tracing and the sandbox cost. Each prints numbers and
checks nothing (docs/tracing.md, docs/tools.md quote them)."""
