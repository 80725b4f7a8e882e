"""``callgate eval``: score a model's tool calls and callgate's execution of them apart.

A suite is a folder of fixtures (``fixture.py``) and the registry of test doubles its tools
run against. The runner (``runner.py``) sends each fixture's recorded model answer through
the real pipeline; ``scoring.py`` turns what was proposed and what happened into the two
tables of ``report.py``, the model's and the executor's; ``compare.py`` sets two reports side
by side for CI. Only the runner does I/O.
"""
