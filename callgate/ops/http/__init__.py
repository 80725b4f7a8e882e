"""The HTTP API (``callgate api``): submit turns, collect results, list tools, decide
approvals and read traces over HTTP, with API keys per principal, and the approval console.

``create_app(settings)`` builds the ASGI app; nothing here runs on import."""
