"""The demo app of the example project: task handlers that show parallel_mcp's whole model."""
