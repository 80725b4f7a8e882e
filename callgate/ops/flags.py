"""Command-line flags that are also ``CALLGATE_…`` variables, shared by every command."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from callgate.core.settings import describe

F = TypeVar("F", bound=Callable[..., Any])


def setting_option(*decls: str, variable: str, **kwargs: Any) -> Callable[[F], F]:
    """A flag that is also the variable ``variable``: its default comes from that variable's
    one declaration (callgate.core.settings), and its help says which variable it is."""
    described = describe(variable)
    kwargs["envvar"] = described.env
    if described.default is not None:
        kwargs.setdefault("default", described.default)
        kwargs.setdefault("show_default", True)
    kwargs["help"] = f"{kwargs.get('help') or described.help} (env {described.env})"
    return click.option(*decls, **kwargs)
