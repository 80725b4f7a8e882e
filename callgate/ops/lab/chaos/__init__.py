"""``callgate chaos``: replayable redelivery and crash scenarios against real processes.

A scenario is one TOML file in ``scenarios/``; ``runner`` runs it in a database and on a
queue of its own, ``faults`` injects its faults as process-level events, ``invariants``
judges it from the database, ``soak`` mixes random faults into a long run, ``cli`` is the
command (``chaos_command``) and ``report`` its table.
"""
