"""Postgres is callgate's source of truth: schema, migrations, reservations, outbox, trace.

Redis is only transport; the relayer (``callgate.daemons.relayer``) publishes committed
results to it.
"""

# The checkout's top-level store/ is a link to this folder, kept for readers. Imported through
# it, every module would load a second time under another name, with its own exception
# classes, so the second path is refused.
if __name__ != "callgate.store":
    raise ImportError(
        "import callgate.store, not store: the checkout's store/ is a link kept for readers"
    )
