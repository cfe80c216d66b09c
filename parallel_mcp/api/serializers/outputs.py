"""Output serializers, for the OpenAPI schema: the objects come from the contract's shapes
(``parallel_mcp.contract.shapes``, the one serialized form of each object at every door); the
envelopes (pages, batches, errors) are declared here."""

from __future__ import annotations

from rest_framework import serializers

from ...contract import shapes

# The objects: generated from the contract's shapes (what the views return through them).
RunOut = shapes.RUN.serializer()
TaskOut = shapes.TASK.serializer()
AttemptOut = shapes.ATTEMPT.serializer()
LeaseOut = shapes.LEASE.serializer()
ContextSnapshotOut = shapes.SNAPSHOT.serializer()
EventOut = shapes.EVENT.serializer()
BlockerOut = shapes.BLOCKER.serializer()
ClaimOut = shapes.CLAIM.serializer()
TaskDetailOut = shapes.TASK_DETAIL.serializer()
ExpireOut = shapes.EXPIRE_RESULT.serializer()
PruneOut = shapes.PRUNE_RESULT.serializer()


# -- envelopes -------------------------------------------------------------------------------


class CurrentContextOut(serializers.Serializer):
    snapshot = ContextSnapshotOut(allow_null=True, help_text="null when the run has no context.")


class TaskBatchOut(serializers.Serializer):
    tasks = TaskOut(many=True)


class ClaimBatchOut(serializers.Serializer):
    claims = ClaimOut(many=True, help_text="In claim order; empty when nothing is claimable.")


class HeartbeatOut(serializers.Serializer):
    lease = LeaseOut()
    cancelled = serializers.BooleanField(
        help_text="Always false here: a cancelled task or run answers 409 lease_conflict with "
        "details.cancelled = true."
    )


class _Page(serializers.Serializer):
    next_cursor = serializers.CharField(
        allow_null=True,
        help_text="Opaque; pass it back as ?cursor= for the next page. null on the last page.",
    )
    next = serializers.URLField(allow_null=True, help_text="The next page's URL, or null.")


class RunPageOut(_Page):
    results = RunOut(many=True)


class TaskPageOut(_Page):
    results = TaskOut(many=True)


class EventPageOut(serializers.Serializer):
    results = EventOut(many=True)
    next_cursor = serializers.IntegerField(
        allow_null=True,
        help_text="Id of the last event returned (the after_id of the next call); after_id "
        "itself when nothing is new; null when nothing and no after_id.",
    )
    has_more = serializers.BooleanField(
        help_text="The page is full: more events may be waiting, call again at once."
    )


class TaskListOut(serializers.Serializer):
    results = TaskOut(many=True)


class ErrorBody(serializers.Serializer):
    code = serializers.CharField(help_text="Stable machine-readable code.")
    message = serializers.CharField()
    details = serializers.DictField(help_text="Ids and fields involved.")


class ErrorOut(serializers.Serializer):
    error = ErrorBody()


class WorkerProcessOut(serializers.Serializer):
    id = serializers.UUIDField(help_text="The process id the worker reported.")
    worker_id = serializers.CharField()
    hostname = serializers.CharField()
    pid = serializers.IntegerField(allow_null=True)
    concurrency = serializers.IntegerField()
    remote = serializers.BooleanField(help_text="Reports through this API (pmcp_worker --api).")
    kinds = serializers.ListField(child=serializers.CharField(), source="kind_names")
    started_at = serializers.DateTimeField()
    last_seen_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(
        help_text="It counts as running until then, unless it reports again."
    )
