"""URLconf of the HTTP API: ``path("api/pmcp/", include("parallel_mcp.api.urls"))``.

Every path below is relative to where it is included; none ends in a slash but ``schema/`` and
``docs/``. Any other path under the prefix answers
404 in the error envelope.
"""

from django.urls import path, re_path

from . import schema  # noqa: F401  (registers the bearer-token OpenAPI extension)
from .errors import not_found_view
from .views import events, maintenance, runs, tasks, worker
from .views import schema as schema_views

app_name = "parallel_mcp_api"

urlpatterns = [
    # runs
    path("runs", runs.RunCollectionView.as_view(), name="runs"),
    path("runs/<uuid:run_id>", runs.RunDetailView.as_view(), name="run"),
    path("runs/<uuid:run_id>/cancel", runs.RunCancelView.as_view(), name="run-cancel"),
    path("runs/<uuid:run_id>/copy", runs.RunCopyView.as_view(), name="run-copy"),
    path("runs/<uuid:run_id>/context", runs.RunContextView.as_view(), name="run-context"),
    path("runs/<uuid:run_id>/events", runs.RunEventsView.as_view(), name="run-events"),
    path("runs/<uuid:run_id>/tasks", runs.RunTasksView.as_view(), name="run-tasks"),
    path(
        "runs/<uuid:run_id>/tasks/batch",
        runs.RunTasksBatchView.as_view(),
        name="run-tasks-batch",
    ),
    # tasks (reads and operator actions)
    path("tasks/pending", tasks.PendingTasksView.as_view(), name="tasks-pending"),
    path("tasks/dead", tasks.DeadTasksView.as_view(), name="tasks-dead"),
    path("tasks/stuck", tasks.StuckTasksView.as_view(), name="tasks-stuck"),
    path("tasks/<uuid:task_id>", tasks.TaskDetailView.as_view(), name="task"),
    path("tasks/<uuid:task_id>/resume", tasks.TaskResumeView.as_view(), name="task-resume"),
    path("tasks/<uuid:task_id>/cancel", tasks.TaskCancelView.as_view(), name="task-cancel"),
    path("tasks/<uuid:task_id>/retry", tasks.TaskRetryView.as_view(), name="task-retry"),
    path("tasks/<uuid:task_id>/requeue", tasks.TaskRequeueView.as_view(), name="task-requeue"),
    # the worker protocol
    path("worker/claim", worker.ClaimView.as_view(), name="worker-claim"),
    path("worker/claim/batch", worker.ClaimBatchView.as_view(), name="worker-claim-batch"),
    path("worker/presence", worker.PresenceView.as_view(), name="worker-presence"),
    path("worker/presence/stop", worker.PresenceStopView.as_view(), name="worker-presence-stop"),
    path("tasks/<uuid:task_id>/running", worker.TaskRunningView.as_view(), name="task-running"),
    path(
        "tasks/<uuid:task_id>/heartbeat",
        worker.TaskHeartbeatView.as_view(),
        name="task-heartbeat",
    ),
    path("tasks/<uuid:task_id>/progress", worker.TaskProgressView.as_view(), name="task-progress"),
    path("tasks/<uuid:task_id>/pause", worker.TaskPauseView.as_view(), name="task-pause"),
    path("tasks/<uuid:task_id>/complete", worker.TaskCompleteView.as_view(), name="task-complete"),
    path("tasks/<uuid:task_id>/fail", worker.TaskFailView.as_view(), name="task-fail"),
    path("tasks/<uuid:task_id>/release", worker.TaskReleaseView.as_view(), name="task-release"),
    # events
    path("events", events.EventsView.as_view(), name="events"),
    path("events/stream", events.EventStreamView.as_view(), name="events-stream"),
    # maintenance
    path(
        "maintenance/expire-leases",
        maintenance.ExpireLeasesView.as_view(),
        name="maintenance-expire-leases",
    ),
    path("maintenance/prune", maintenance.PruneView.as_view(), name="maintenance-prune"),
    # OpenAPI
    path("schema/", schema_views.SchemaView.as_view(), name="schema"),
    path("docs/", schema_views.DocsView.as_view(), name="docs"),
    # anything else under the prefix
    re_path(r"^[\s\S]*$", not_found_view, name="not-found"),
]
