"""Postgres is callgate's source of truth: schema, migrations, reservations, outbox, trace.

Redis is only transport; the relayer (``callgate.store.relayer``) publishes committed results to it.
"""
