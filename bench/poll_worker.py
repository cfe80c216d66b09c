"""A pmcp worker with LISTEN/NOTIFY switched off (``Worker(listen=False)``), for the polling
figure of the enqueue -> start latency on PostgreSQL; pmcp_worker has no flag for that.

    DJANGO_SETTINGS_MODULE=bench.settings python -m bench.poll_worker --worker-id ID
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker-id", default=None)
    args = parser.parse_args(argv)

    import django

    django.setup()
    from parallel_mcp.management.arguments import configure_logging
    from parallel_mcp.worker.loop import Worker

    configure_logging(1)
    worker = Worker(concurrency=1, worker_id=args.worker_id, listen=False)
    worker.install_signal_handlers()
    return worker.run()


if __name__ == "__main__":
    sys.exit(main())
