"""Forward-only migrations with Alembic, driven from code (no alembic.ini to find)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, text

from callgate.store.schema import SCHEMA

_SCRIPTS = Path(__file__).with_name("migrations")


def alembic_config(engine: Engine) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(_SCRIPTS))
    cfg.attributes["engine"] = engine
    return cfg


def upgrade(engine: Engine) -> None:
    """Apply every migration not yet applied. Safe to run from several processes at once."""
    with engine.begin() as conn:
        # Two processes migrating at once would race on CREATE SCHEMA; serialise them.
        conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('callgate.migrate'))"))
        conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
        cfg = alembic_config(engine)
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
