"""Client tokens of completions and failures: a repeated call with the same token returns the
first call's result instead of applying twice (how: docs/internals.md, "Client tokens")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from ..exceptions import IdempotencyConflictError
from ..models import ClientTokenRecord, Task
from .statements import Result
from .write import Write

TOKEN_COLUMNS = (("token", "text"), ("task_id", "uuid"))  # for Dialect.rows


def send_record(
    w: Write, tokens: Sequence[tuple[str, UUID]], outcome: str, principal: str | None
) -> Result | None:
    """Queue the recording of (token, task id) pairs; the result's rows are the tokens this
    write recorded."""
    if not tokens:
        return None
    return w.db.send(*record_sql(w, tokens, outcome, principal, returning="token"))


def record_sql(
    w: Write,
    tokens: Sequence[tuple[str, UUID]],
    outcome: str,
    principal: str | None,
    *,
    returning: str,
    held: str = "",
) -> tuple[str, list[Any]]:
    """The statement that records (token, task id) pairs, returning ``returning`` of the
    rows it recorded (alone, or a CTE of the guard that applies them: ``held``, its term
    ``Write.held``)."""
    d = w.d
    # The pairs as rows: one statement text whatever their number (see Dialect.uuid_pairs);
    # the tasks looked up by key (the rows are guessed a hundred: a small table is scanned).
    source, pairs = d.rows(TOKEN_COLUMNS, [(token, d.uuid(task)) for token, task in tokens])
    ids_sql, ids = d.uuids([task_id for _, task_id in tokens])
    return (
        f"WITH v (token, task_id) AS ({source}) "
        "INSERT INTO pmcp_client_token (token, run_id, task_id, outcome, created_at, principal) "
        f"SELECT v.token, t.run_id, t.id, %s, {d.timestamp}, %s FROM v, pmcp_task t "
        f"WHERE {held}t.id {ids_sql} AND t.id = v.task_id "
        f"ON CONFLICT (token) DO NOTHING RETURNING {returning}",
        [*pairs, outcome, d.when(w.now), principal, *ids],
    )


def recorded(result: Result | None) -> set[str]:
    return {row[0] for row in result.fetchall()} if result is not None else set()


def replay(
    using: str, token: str, task_id: UUID, outcome: str, principal: str | None
) -> Task | IdempotencyConflictError | None:
    """For a token this write did not record: the task as the first call left it, the
    conflict when the token was used for something else, or None when no record exists
    (the task itself does not exist: the caller explains that)."""
    record = ClientTokenRecord.objects.using(using).filter(token=token).first()
    if record is None:
        return None
    if record.task_id != task_id or record.outcome != outcome or record.principal != principal:
        return IdempotencyConflictError(
            f"Client token {token!r} was already used to mark task {record.task_id} "
            f"{record.outcome}.",
            client_token=token,
            task_id=record.task_id,
            outcome=record.outcome,
        )
    return Task.objects.using(using).get(pk=task_id)


def take_back(w: Write, token: str) -> None:
    """Forget a token this write recorded for an item it could not apply (a batch goes on)."""
    w.defer("DELETE FROM pmcp_client_token WHERE token = %s", [token])
