"""The peers of the bench: other job queues that run the same no-op burn-down as parallel_mcp.

``systems.py`` describes each one (its worker command, the settings chosen and why, how its
rows tell when each worker started and when each task finished); it runs in the driver and
imports no peer. The other modules run in the peers' own processes, some under a second
virtualenv (Python >= 3.12, see the Makefile's ``venv-bench-peers``): ``settings`` (Django
settings for the Django-based peers), ``seed`` (schema and N ready tasks), ``oban_jobs``,
``procrastinate_tasks`` and ``dbos_app`` (each peer's no-op task), ``logfilter``.
"""
