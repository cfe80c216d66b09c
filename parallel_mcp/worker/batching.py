"""Group commit for completions: slots that finish while another slot's completion is being
written hand theirs to the next write, so N tasks finishing together cost one transaction
(one fsync on SQLite) instead of N. Nothing waits on purpose: a lone completion is written at
once, exactly as a single ``complete_task`` would be."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

Flush = Callable[[Sequence[dict[str, Any]]], Sequence[Any]]


class _Pending:
    __slots__ = ("done", "item", "raised", "result")

    def __init__(self, item: dict[str, Any]) -> None:
        self.item = item
        self.result: Any = None
        self.raised: BaseException | None = None
        self.done = False


class CompletionBatcher:
    """``submit`` returns what ``flush`` returned for the item (a task or an exception
    object), or raises what ``flush`` raised for the whole batch."""

    def __init__(self, flush: Flush, *, max_batch: int = 100) -> None:
        self._flush = flush
        self._max_batch = max_batch
        self._lock = threading.Condition()
        self._queue: list[_Pending] = []
        self._writing = False

    def submit(self, item: dict[str, Any]) -> Any:
        pending = _Pending(item)
        with self._lock:
            self._queue.append(pending)
            while not pending.done:
                if self._writing:
                    self._lock.wait()
                    continue
                # Become the writer for everything queued so far (ours included).
                batch = self._queue[: self._max_batch]
                del self._queue[: self._max_batch]
                self._writing = True
                self._lock.release()
                try:
                    results: Sequence[Any] | BaseException
                    try:
                        results = self._flush([entry.item for entry in batch])
                    except BaseException as exc:  # noqa: BLE001 - handed to every submitter
                        results = exc
                finally:
                    self._lock.acquire()
                    self._writing = False
                for index, entry in enumerate(batch):
                    if isinstance(results, BaseException):
                        entry.raised = results
                    else:
                        entry.result = results[index]
                    entry.done = True
                self._lock.notify_all()
        if pending.raised is not None:
            raise pending.raised
        return pending.result
