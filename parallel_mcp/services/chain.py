"""A write's final statements, chained: on PostgreSQL as few statements as their order allows,
each a data-modifying CTE of the events' insert; elsewhere one by one. The rules that keep a
chain equal to its statements sent one after the other: docs/internals.md, "Chains".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .dialect import Dialect

# Channel of the NOTIFY that wakes idle workers (parallel_mcp.worker.wakeup listens).
WAKE_CHANNEL = "parallel_mcp"
# Wakes idle workers on commit (the channel its parameter).
WAKE = "SELECT pg_notify(%s, '')"

_WRITES = re.compile(r"(INSERT INTO|UPDATE|DELETE FROM) (\w+) ")


@dataclass(frozen=True)
class Deferred:
    """A statement whose result nobody reads. ``wakes``: wake idle workers (PostgreSQL's
    NOTIFY, on commit) when it changed a row."""

    sql: str
    params: Sequence[Any]
    wakes: bool = False


@dataclass(frozen=True)
class Main:
    """The statement a chain ends with (the events' insert). ``sql`` holds ``{gate}`` where
    a scalar subquery goes that must run before its first row is made; it selects ``gate``
    (with its ``gate_params``, which follow ``params`` in the text), or nothing when
    ``gate`` is empty."""

    sql: str
    params: Sequence[Any]
    gate: str = ""
    gate_params: Sequence[Any] = ()

    def render(self, source: str = "") -> tuple[str, list[Any]]:
        """The statement, its gate selected ``FROM source`` when given."""
        if not self.gate:
            return self.sql.replace("{gate}", ""), list(self.params)
        # The condition on the count keeps it computed (else the sub-statements could run
        # after the main statement, the NOTIFY not at all).
        gate = f"(SELECT {self.gate}{f' FROM {source} AS d WHERE d.n >= 0' if source else ''})"
        return self.sql.replace("{gate}", gate), [*self.params, *self.gate_params]


def statements(
    d: Dialect, deferred: Sequence[Deferred], *, notify: bool, main: Main | None
) -> list[tuple[str, list[Any]]]:
    """The statements to send, in order, for ``deferred`` then ``main``, and a NOTIFY when
    ``notify`` (PostgreSQL)."""
    if not d.chains:
        sent = [(item.sql, list(item.params)) for item in deferred]
        if main is not None:
            sent.append(main.render())
        return sent
    sent = []
    chain: list[Deferred] = []
    written: set[str] = set()
    for item in deferred:
        target = _WRITES.match(item.sql)
        if target is None or " RETURNING " in item.sql:
            if chain:
                sent.append(_chained(chain, notify=False, main=None))
                chain, written = [], set()
            sent.append(_alone(item))
            continue
        verb, table = target.groups()
        if verb != "INSERT INTO" and table in written:
            sent.append(_chained(chain, notify=False, main=None))
            chain, written = [], set()
        chain.append(item)
        written.add(table)
    if chain or notify or main is not None:
        sent.append(_chained(chain, notify=notify, main=main))
    return sent


def _alone(item: Deferred) -> tuple[str, list[Any]]:
    if not item.wakes:
        return item.sql, list(item.params)
    return (
        f"WITH moved AS ({item.sql} RETURNING 1) {WAKE} WHERE EXISTS (SELECT 1 FROM moved)",
        [*item.params, WAKE_CHANNEL],
    )


def _chained(
    chain: Sequence[Deferred], *, notify: bool, main: Main | None
) -> tuple[str, list[Any]]:
    if len(chain) == 1 and not notify and main is None:
        return _alone(chain[0])
    ctes = []
    params: list[Any] = []
    for index, item in enumerate(chain):
        ctes.append(f"c{index} AS ({item.sql} RETURNING 1)")
        params += item.params
    done = [f"SELECT 1 FROM c{index}" for index in range(len(chain))]
    wakers = [f"EXISTS (SELECT 1 FROM c{i})" for i, item in enumerate(chain) if item.wakes]
    if notify or wakers:
        condition = "" if notify else f" WHERE {' OR '.join(wakers)}"
        ctes.append(f"wake AS ({WAKE}{condition})")
        params.append(WAKE_CHANNEL)
        done.append("SELECT 1 FROM wake")
    # Reading every sub-statement's rows runs them to the end, in this order, before anything
    # the main statement does after: its gate is evaluated over their count.
    count = f"(SELECT count(*) AS n FROM ({' UNION ALL '.join(done)}) AS d)"
    if main is None:
        return f"WITH {', '.join(ctes)} SELECT n FROM {count} AS d", params
    if not ctes:
        return main.render()
    sql, main_params = main.render(count)
    return f"WITH {', '.join(ctes)} {sql}", [*params, *main_params]
