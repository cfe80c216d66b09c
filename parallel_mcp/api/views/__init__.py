"""API views, one module per resource; all thin over the Orchestrator."""
