"""``python -m callgate.ops.lab.chaos``: the ``callgate chaos`` command."""

from callgate.ops.lab.chaos.cli import main

main()
