"""``python -m callgate.ops.chaos``: the ``callgate chaos`` command."""

from callgate.ops.chaos.cli import main

main()
