"""``python -m callgate``: the same CLI as the ``callgate`` command."""

from callgate.ops.cli.main import main

main()
