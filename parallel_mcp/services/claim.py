"""Claiming ready tasks: ``claim_next_task`` and ``claim_next_tasks`` (a batch in one
transaction), one implementation, optionally straight into ``running``; its two phases are
in docs/internals.md, "Claims"."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import Any
from uuid import UUID

from ..actors import current as current_actor
from ..actors import current_principal
from ..contract import arguments as a
from ..contract import limits
from ..contract import validation as v
from ..exceptions import IdempotencyConflictError, PermissionDeniedError
from ..ids import new_id
from ..models import Attempt, Run, Task
from ..models.tasks import CLAIM_ORDER_SQL, claim_order_key
from ..results import Claim
from .dialect import (
    Dialect,
    columns,
    dialect_for,
    instances,
    saved_instance,
    typed_columns,
    uuid_array,
)
from .leases import lease_of, record_running
from .write import Write, write

# A claim's attempt row (which holds its lease), column by column: a column of the claimed
# task ("task.<column>"), the lease's client token ("token"), or a value the whole claim shares
# (a key of ``_shared``). The one definition of the row, per vendor as docs/internals.md says.
ATTEMPT_ROW = {
    "id": "task.lease_id",
    "run_id": "task.run_id",
    "task_id": "task.id",
    "worker_id": "worker_id",
    "status": "attempt_status",
    "leased_at": "now",
    "started_at": "started_at",
    "lease_expires_at": "expires_at",
    "client_token": "token",
    "principal": "principal",
}
# (column, PostgreSQL type), as Dialect.rows takes them
ROW_COLUMNS = typed_columns(Attempt, tuple(ATTEMPT_ROW))
# column, the task's attribute or None, source
ROW_PLAN = tuple(
    (c, s.removeprefix("task.") if s.startswith("task.") else None, s)
    for c, s in ATTEMPT_ROW.items()
)
# the fields the row leaves NULL
ROW_UNSET = {f.attname: None for f in Attempt._meta.concrete_fields if f.attname not in ATTEMPT_ROW}
# A batch's leases take ``client_token#<n>``, n their place in claim order.
BATCH_TOKEN = f"%s || (row_number() OVER (ORDER BY {CLAIM_ORDER_SQL}) - 1)"

# Client tokens lock in their own namespace of two-key advisory locks (the event fence uses a
# one-key lock; the two never collide).
TOKEN_LOCK_NAMESPACE = 0x706D6374  # "pmct"


def claim_next_task(
    *,
    using: str,
    worker_id: str,
    lease_ms: int,
    kinds: Any = None,
    client_token: str | None = None,
    start: bool = False,
    now: datetime | None = None,
) -> Claim | None:
    """The best ready task, leased to ``worker_id`` (``start=True``: straight to running, as
    ``mark_task_running`` would, in the same transaction)."""
    request = claim_request(now, worker_id, lease_ms, kinds, client_token, start, limit=1)
    claims = _claim(using, request)
    return claims[0] if claims else None


def claim_next_tasks(
    *,
    using: str,
    worker_id: str,
    limit: Any,
    lease_ms: int,
    kinds: Any = None,
    client_token: str | None = None,
    start: bool = False,
    now: datetime | None = None,
) -> list[Claim]:
    """Up to ``limit`` ready tasks in claim order, in one transaction. Each lease gets
    ``client_token#<n>`` when a token is given, so a retried call replays the whole batch."""
    request = claim_request(
        now, worker_id, lease_ms, kinds, client_token, start, limit=limit, batch=a.CLAIM_LIMIT
    )
    return _claim(using, request)


def allowed_worker_id(worker_id: str) -> str:
    """A caller bound to a worker-id prefix (a token with one, see parallel_mcp.actors) may
    claim only as worker ids that start with it."""
    actor = current_actor()
    if actor is not None and actor.worker_prefix and not worker_id.startswith(actor.worker_prefix):
        raise PermissionDeniedError(
            f"worker_id {worker_id!r} is not allowed for {actor.principal}: its worker ids must "
            f"start with {actor.worker_prefix!r}.",
            field="worker_id",
            worker_prefix=actor.worker_prefix,
        )
    return worker_id


@dataclass(frozen=True)
class ClaimRequest:
    """A validated claim: who claims, what, and the ids made for it before the transaction."""

    now: datetime
    worker_id: str
    kinds: list[str] | None
    client_token: str | None
    start: bool
    limit: int
    numbered: bool  # a batch's leases carry "<client_token>#<n>", n their place in claim order
    principal: str | None
    expires_at: datetime
    fresh: list[UUID]  # the leases' ids

    def token_of(self, index: int) -> str | None:
        """The client token of the claim's ``index``-th lease (in claim order)."""
        if self.client_token is None or not self.numbered:
            return self.client_token
        return f"{self.client_token}#{index}"


def claim_request(
    now: Any,
    worker_id: Any,
    lease_ms: Any,
    kinds: Any,
    client_token: Any,
    start: Any,
    *,
    limit: Any,
    batch: a.Integer | None = None,
) -> ClaimRequest:
    """The arguments of a claim validated; ``batch``: the kind of a batch's ``limit`` (its
    leases' tokens numbered), None for a single claim."""
    now = v.resolve_now(now)
    worker_id = allowed_worker_id(v.text(worker_id, "worker_id"))
    lease_ms = v.lease_ms(lease_ms)
    kinds = v.kinds(kinds)
    token_length = limits.NAME_LENGTH if batch is None else limits.BATCH_TOKEN_LENGTH
    client_token = v.text(client_token, "client_token", max_length=token_length, allow_none=True)
    start = v.flag(start, "start")
    if batch is not None:
        limit = batch.check(limit, "limit")
    return ClaimRequest(
        now=now,
        worker_id=worker_id,
        kinds=kinds,
        client_token=client_token,
        start=start,
        limit=limit,
        numbered=batch is not None,
        principal=current_principal(),
        expires_at=now + timedelta(milliseconds=lease_ms),
        fresh=[new_id() for _ in range(limit)],
    )


def token_lock(using: str, request: ClaimRequest) -> tuple[str, list[Any]] | None:
    """The lock of a claim's client token (PostgreSQL; SQLite writers are serial anyway), for
    ``write(lock=…)``, which takes it first: twins wait there (docs/internals.md)."""
    if request.client_token is None or dialect_for(using).vendor != "postgresql":
        return None
    return "pg_advisory_xact_lock(%s, hashtext(%s))", [TOKEN_LOCK_NAMESPACE, request.client_token]


def _claim(using: str, request: ClaimRequest) -> list[Claim]:
    with write(using=using, now=request.now, lock=token_lock(using, request)) as w:
        with w.db.batch():
            sent = send_claim(w, request)
        return take_claims(w, request, sent)


def send_claim(w: Write, request: ClaimRequest) -> tuple[Any, Any, Any]:
    """Queue phase 1 of a claim (in the caller's batch): the token check and the guarded
    update; ``take_claims`` reads what they returned."""
    return _send_token_check(w, request), *_send_claim(w, request)


def take_claims(w: Write, request: ClaimRequest, sent: tuple[Any, Any, Any]) -> list[Claim]:
    """The claims of phase 1 (or the replay of a used token), their attempts, leases and
    events recorded on the write."""
    used, tasks, runs = sent
    if tasks is None:  # SQLite: the update's result is read at once
        tasks, runs = _claimed(w, runs)
        was_used = used is not None and used.fetchone() is not None
    else:
        tasks, runs, was_used = _claimed_pg(w, tasks, tokened=request.client_token is not None)
    if was_used:
        return _replay(w.using, request)
    if not tasks:
        return []
    tasks.sort(key=claim_order_key)
    return _record(w, tasks, runs, request)


def _send_token_check(w: Write, request: ClaimRequest) -> Any:
    """SQLite: whether the claim's token was used. PostgreSQL's claim probes it in its own
    statement, after the token's lock (``token_lock``, which the write must have taken)."""
    if request.client_token is None:
        return None
    if w.d.vendor == "postgresql":
        assert w.lock == token_lock(w.using, request), "write(lock=token_lock(…))"
        return None
    return w.db.send(USED_SQL, [request.token_of(0)])


# A claim that took anything wrote its first token (a batch numbers its leases from #0): one
# probe of the unique index says whether the token was used.
USED_SQL = "SELECT 1 FROM pmcp_attempt WHERE client_token = %s"


def candidates_sql(d: Dialect, *, now: datetime, kinds: list[str] | None) -> tuple[str, list]:
    """Ready tasks in claim order (its last parameter, the LIMIT, is the caller's). Spelled
    like the partial index ``pmcp_task_claim_idx`` so SQLite can prove the index applies; on
    PostgreSQL rows other claims hold are skipped, never waited for."""
    where = f"{d.claim_ready} AND (not_before IS NULL OR not_before <= %s)"
    params: list[Any] = [d.when(now)]
    if kinds:
        kinds_sql, kinds_params = d.in_list(kinds)
        where += f" AND kind {kinds_sql}"
        params += kinds_params
    sql = (
        f"SELECT id FROM pmcp_task WHERE {where} ORDER BY {CLAIM_ORDER_SQL} LIMIT %s{d.skip_locked}"
    )
    return sql, params


def anything_ready(using: str, *, now: datetime, kinds: list[str] | None) -> bool:
    """Whether a claim could take something now: the claim's own candidate query, without
    locking (a worker looks before it writes)."""
    from django.db import connections

    d = dialect_for(using)
    sql, params = candidates_sql(d, now=now, kinds=kinds)
    sql = sql.removesuffix(d.skip_locked)
    with connections[using].cursor() as cursor:
        cursor.execute(sql, [*params, 1])
        return cursor.fetchone() is not None


def _shared(request: ClaimRequest, now: datetime) -> dict[str, Any]:
    """The values every attempt row of a claim shares (see ATTEMPT_ROW)."""
    return {
        "worker_id": request.worker_id,
        "attempt_status": "running" if request.start else "leased",
        "now": now,
        "started_at": now if request.start else None,
        "expires_at": request.expires_at,
        "principal": request.principal,
    }


def _sent(d: Dialect, shared: dict[str, Any]) -> dict[str, Any]:
    """The shared values as the database takes them (timestamps by ``Dialect.when``)."""
    return {k: d.when(v) if isinstance(v, datetime) else v for k, v in shared.items()}


def _selected_row(d: Dialect, request: ClaimRequest, now: datetime) -> tuple[str, list]:
    """The claimed tasks' attempt insert as a CTE of the claim (PostgreSQL), selecting from
    its ``u``."""
    sent = _sent(d, _shared(request, now))
    token_sql = "NULL"
    if request.client_token is not None:
        token_sql = BATCH_TOKEN if request.numbered else "%s"
        sent["token"] = f"{request.client_token}#" if request.numbered else request.client_token
    sql, sources = _select(d.timestamp, token_sql)
    return sql, [sent[source] for source in sources]


@cache
def _select(timestamp: str, token_sql: str) -> tuple[str, list[str]]:
    """The ``INSERT … SELECT`` from ``u`` and the sources of its parameters."""
    terms, sources = [], []
    for (_, kind), (_, attr, source) in zip(ROW_COLUMNS, ROW_PLAN, strict=True):
        if attr is not None:
            terms.append(attr)  # the claimed row's column
        elif source == "token":
            terms.append(token_sql)
            sources += ["token"] if "%s" in token_sql else []
        else:
            terms.append(timestamp if kind == "timestamptz" else "%s")
            sources.append(source)
    names = ", ".join(column for column, _ in ROW_COLUMNS)
    return f"INSERT INTO pmcp_attempt ({names}) SELECT {', '.join(terms)} FROM u", sources


def _send_claim(w: Write, request: ClaimRequest) -> tuple[Any, Any]:
    """Lease the best candidates, each with its own fresh lease id."""
    d, now = w.d, w.now
    kinds, start, limit = request.kinds, request.start, request.limit
    first_token = request.token_of(0)
    candidates, where_params = candidates_sql(d, now=now, kinds=kinds)
    set_sql = (
        "status = %s, attempt_count = attempt_count + 1, leased_by = %s, lease_expires_at = %s, "
        "lease_principal = %s, not_before = NULL, updated_at = %s"
        + (", started_at = COALESCE(started_at, %s)" if start else "")
    )
    set_params: list[Any] = [
        "running" if start else "leased",
        request.worker_id,
        d.when(request.expires_at),
        request.principal,
        d.when(now),
    ]
    if start:
        set_params.append(d.when(now))
    unused_sql, unused_params = "", []
    used, used_params, used_column, source = "", [], "", "u JOIN pmcp_run r ON r.id = u.run_id"
    if first_token is not None and d.vendor == "postgresql":
        # The token's probe in the claim's statement (after its lock's): the claim takes
        # nothing when it was used, and the one row it then returns says so.
        used = f"token AS MATERIALIZED (SELECT EXISTS ({USED_SQL}) AS used), "
        used_params = [first_token]
        unused_sql = " AND NOT (SELECT used FROM token)"
        used_column = "token.used, "
        source = f"token LEFT JOIN ({source}) ON true"
    elif first_token is not None:
        unused_sql, unused_params = f" AND NOT EXISTS ({USED_SQL})", [first_token]
    leases = [d.uuid(lease_id) for lease_id in request.fresh]
    # One task: the best candidate, by key.
    single = (
        f"UPDATE pmcp_task SET lease_id = %s, {set_sql} WHERE id = ({candidates}) "
        f"AND status = 'queued'{unused_sql} RETURNING {columns(Task)}"
    )
    single_params = [leases[0], *set_params, *where_params, 1, *unused_params]
    if d.vendor == "postgresql":
        if limit == 1:
            picked, update, params = "", single, [*used_params, *single_params]
        else:
            # Numbered once (MATERIALIZED: a rescan would number again), each candidate joins
            # one fresh lease id; which id goes to which task does not matter, only that they
            # differ.
            picked = (
                "picked AS MATERIALIZED (SELECT id, row_number() OVER () AS n "
                f"FROM ({candidates}) c), "
            )
            update = (
                f"UPDATE pmcp_task t SET lease_id = fresh.lease_id, {set_sql} "
                "FROM picked JOIN unnest(%s::uuid[]) WITH ORDINALITY AS fresh(lease_id, n) "
                f"USING (n) WHERE t.id = picked.id AND t.status = 'queued'{unused_sql} "
                f"RETURNING {columns(Task, 't.')}"
            )
            params = [
                *used_params,
                *where_params,
                limit,
                *set_params,
                uuid_array(leases),
                *unused_params,
            ]
        insert, insert_params = _selected_row(d, request, now)
        rows = w.db.send(
            f"WITH {used}{picked}u AS ({update}), i AS ({insert}) "
            f"SELECT {used_column}u.*, {columns(Run, 'r.')} FROM {source}",
            [*params, *insert_params],
        )
        return rows, None
    # SQLite: its write lock is held since BEGIN IMMEDIATE, so reading first is as safe.
    taken: list[Any]
    if limit == 1:
        taken = w.db.send(single, single_params).fetchall()
    else:
        ids = [row[0] for row in w.db.send(candidates, [*where_params, limit]).fetchall()]
        if not ids:
            return None, []
        cases = " ".join(["WHEN %s THEN %s"] * len(ids))
        case_params = [value for pair in zip(ids, leases, strict=False) for value in pair]
        in_sql, in_params = d.in_list(ids)
        taken = w.db.send(
            f"UPDATE pmcp_task SET lease_id = (CASE id {cases} END), {set_sql} "
            f"WHERE id {in_sql} AND status = 'queued'{unused_sql} RETURNING {columns(Task)}",
            [*case_params, *set_params, *in_params, *unused_params],
        ).fetchall()
    return None, taken


def _claimed_pg(
    w: Write, result: Any, *, tokened: bool
) -> tuple[list[Task], dict[UUID, Run], bool]:
    """The claimed tasks, their runs, and whether the claim's token was used before (with a
    token the first column says so, and a claim that took nothing returns one empty row)."""
    rows = result.fetchall()
    used = False
    if tokened:
        used = bool(rows) and bool(rows[0][0])
        rows = [row[1:] for row in rows if row[1] is not None]
    width = len(Task._meta.concrete_fields)
    tasks = instances(Task, w.using, [row[:width] for row in rows])
    # Each row carries its run: one instance per run (its id is the first of its columns).
    run_rows = list({row[width]: row[width:] for row in rows}.values())
    runs = {run.pk: run for run in instances(Run, w.using, run_rows)}
    return tasks, runs, used


def _claimed(w: Write, rows: list[Any]) -> tuple[list[Task], dict[UUID, Run]]:
    tasks = instances(Task, w.using, rows)
    if not tasks:
        return [], {}
    in_sql, in_params = w.d.uuids(sorted({task.run_id for task in tasks}))
    run_rows = w.db.send(f"SELECT {columns(Run)} FROM pmcp_run WHERE id {in_sql}", in_params)
    return tasks, {run.pk: run for run in instances(Run, w.using, run_rows.fetchall())}


def _record(
    w: Write, tasks: list[Task], runs: dict[UUID, Run], request: ClaimRequest
) -> list[Claim]:
    """The claimed tasks' attempts and leases as instances (on SQLite their rows, inserted
    with the flush; PostgreSQL's claim inserted them), and their events."""
    d, start, worker_id = w.d, request.start, request.worker_id
    shared = _shared(request, w.now)
    sent, uuid = _sent(d, shared), d.uuid
    insert = d.vendor != "postgresql"
    # What the rows share, what each takes from its task.
    fixed = {**ROW_UNSET, **{c: shared[s] for c, t, s in ROW_PLAN if not t and s != "token"}}
    taken = [(column, attr) for column, attr, _ in ROW_PLAN if attr]
    expires_iso = request.expires_at.isoformat()
    claims = []
    for index, task in enumerate(tasks):
        lease_id = task.lease_id
        assert lease_id is not None  # just leased
        token = request.token_of(index)
        sent["token"] = token
        values = {**fixed, "client_token": token}
        for column, attr in taken:
            values[column] = getattr(task, attr)
        if insert:
            sent_row = [uuid(values[c]) if t else sent[s] for c, t, s in ROW_PLAN]
            w.insert("pmcp_attempt", ROW_COLUMNS, sent_row)
        # A saved instance, every field given: no Model.__init__.
        attempt = saved_instance(Attempt, w.using, values)
        w.event(
            "task.claimed",
            run_id=task.run_id,
            task_id=task.pk,
            attempt_id=lease_id,
            payload={
                "worker_id": worker_id,
                "lease_id": str(lease_id),
                "lease_expires_at": expires_iso,
                "attempt": task.attempt_count,
            },
        )
        if start:
            record_running(
                w, run_id=task.run_id, task_id=task.pk, lease_id=lease_id, worker=worker_id
            )
        claim = Claim(
            run=runs[task.run_id], task=task, attempt=attempt, lease=lease_of(attempt, w.using)
        )
        claims.append(claim)
    return claims


def _replay(using: str, request: ClaimRequest) -> list[Claim]:
    """The claims a client token already took, in claim order; the token must have been used
    by this worker and principal."""
    # Every token its leases may carry: an IN list the unique index serves, with no collation
    # or prefix surprises (a single claim's "job#abc" is not batch "job").
    tokens = [request.token_of(n) for n in range(limits.MAX_CLAIM_BATCH if request.numbered else 1)]
    attempts = list(
        Attempt.objects.using(using).select_related("task", "run").filter(client_token__in=tokens)
    )
    if any(
        attempt.worker_id != request.worker_id or attempt.principal != request.principal
        for attempt in attempts
    ):
        raise IdempotencyConflictError(
            f"Client token {request.client_token!r} was used by another worker or principal.",
            client_token=request.client_token,
        )
    if request.numbered:
        attempts.sort(key=lambda attempt: int((attempt.client_token or "#0").rsplit("#", 1)[1]))
    return [
        Claim(run=attempt.run, task=attempt.task, attempt=attempt, lease=lease_of(attempt, using))
        for attempt in attempts
    ]
