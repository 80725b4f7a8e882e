"""Tools served by MCP servers, as callgate tools.

``CALLGATE_MCP_CONFIG`` names a JSON file in the format MCP hosts use
(``{"mcpServers": {NAME: {...}}}``). Each process that loads the registry connects to the
configured servers through the official ``mcp`` SDK (``client``), lists their tools
(``discovery``), records each tool's definition as a version in Postgres
(``callgate.store.mcp_catalog``) and adds them to the registry as ``NAME__TOOL``
(``tools``), classified from their annotations. Calls then go through the whole gate and the
queue like any other tool's.
"""
