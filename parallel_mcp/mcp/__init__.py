"""MCP: task-capable tools declared in a Django project (``@tool``, importable without the MCP
SDK), and the MCP server (``manage.py pmcp_mcp``), which needs the ``mcp`` extra:
``pip install 'parallel-mcp[mcp]'``.
"""

from .declare import TASK_MODES, tool, tool_kind

__all__ = ["TASK_MODES", "tool", "tool_kind"]
