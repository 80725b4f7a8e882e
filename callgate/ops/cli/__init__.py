"""The ``callgate`` command line: one module per concern (processes, turns, approvals,
maintenance, common), ``main`` for the group and the console entry point."""
