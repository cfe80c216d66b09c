"""Signals sent by parallel_mcp.

``event_recorded`` is sent once per event row, with ``event=<Event>``, only after the
transaction that wrote it commits. A receiver's exception is logged and never breaks the write.
"""

from django.dispatch import Signal

event_recorded = Signal()
