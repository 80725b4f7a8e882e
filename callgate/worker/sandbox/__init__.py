"""The built-in code-execution tool and its sandbox (bubblewrap, seccomp, rlimits).

The sandbox starts processes, so it lives on the worker's side, not in ``callgate.tools``
(pure). ``python_tool()`` returns a ``Tool`` to put in a registry; see docs/tools.md.
"""

from callgate.worker.sandbox.limits import Limits
from callgate.worker.sandbox.tool import RunResult, python_tool

__all__ = ["Limits", "RunResult", "python_tool"]
