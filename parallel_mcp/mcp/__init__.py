"""The MCP server: the Orchestrator's methods as MCP tools (``manage.py pmcp_mcp``).

Needs the ``mcp`` extra: ``pip install 'parallel-mcp[mcp]'``.
"""
