"""A peer's schema and ``--tasks`` ready no-op tasks in the bench's work database, with the
peer's own API, in the peer's own interpreter (bench/peers/systems.py runs this):

    python -m bench.peers.seed SYSTEM --tasks N

The driver starts from a blank database, runs this, and keeps the result as the template that
every measured run of SYSTEM starts from.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

BATCH = 1_000


def _django_migrate() -> None:
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def seed_dtdb(tasks: int) -> None:
    _django_migrate()
    from django.utils import timezone
    from django_tasks_db.models import DBTaskResult, get_date_max

    now = timezone.now()
    rows = [
        DBTaskResult(
            args_kwargs={"args": [], "kwargs": {}},
            priority=0,
            task_path="bench.benchapp.tasks.noop",
            queue_name="default",
            backend_name="default",
            run_after=get_date_max(),
            enqueued_at=now,
        )
        for _ in range(tasks)
    ]
    DBTaskResult.objects.bulk_create(rows, batch_size=BATCH)


def seed_ox(tasks: int) -> None:
    _django_migrate()
    from django_ox.bulk import enqueue_many  # one INSERT per chunk of rows

    from bench.benchapp.tasks import noop

    left = tasks
    while left:
        count = min(left, BATCH)
        enqueue_many(noop, [((), {})] * count)
        left -= count


def seed_procrastinate(tasks: int) -> None:
    _django_migrate()
    from bench.peers.procrastinate_tasks import noop

    left = tasks
    while left:
        count = min(left, BATCH)
        noop.batch_defer(*([{}] * count))
        left -= count


def seed_oban(tasks: int) -> None:
    from oban import Oban
    from oban.schema import install

    from bench.peers.oban_jobs import Noop

    dsn = (
        f"postgresql://{os.environ['PMCP_PG_USER']}@{os.environ['PMCP_PG_HOST']}:"
        f"{os.environ['PMCP_PG_PORT']}/{os.environ['PMCP_PG_DB']}"
    )

    async def run() -> None:
        pool = await Oban.create_pool(dsn=dsn)
        try:
            await install(pool)
            async with Oban(pool=pool) as oban:  # client mode: no queues
                left = tasks
                while left:
                    count = min(left, BATCH)
                    await oban.enqueue_many(*[Noop.new({}) for _ in range(count)])
                    left -= count
        finally:
            await pool.close()

    asyncio.run(run())


def seed_dbos(tasks: int) -> None:
    from bench.peers.dbos_app import seed

    seed(tasks)


SEEDERS = {
    "dtdb": seed_dtdb,
    "ox": seed_ox,
    "procrastinate": seed_procrastinate,
    "oban": seed_oban,
    "dbos": seed_dbos,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("system", choices=sorted(SEEDERS))
    parser.add_argument("--tasks", type=int, required=True)
    args = parser.parse_args(argv)
    SEEDERS[args.system](args.tasks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
