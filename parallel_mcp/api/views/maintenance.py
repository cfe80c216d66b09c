"""Maintenance for operators: expire leases, prune finished runs."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from drf_spectacular.utils import OpenApiExample
from rest_framework.response import Response

from ...contract import shapes
from ..permissions import OPERATE
from ..schema import api_schema
from ..serializers import inputs, outputs
from .base import ApiView


class ExpireLeasesView(ApiView):
    access = OPERATE
    tags = ("maintenance",)

    @api_schema(
        operation_id="maintenance_expire_leases",
        summary="Expire leases that ran out",
        description="What pmcp_expire_leases does once: requeue (with backoff) or dead-letter "
        "every task whose lease expired.",
        request=inputs.EmptyIn,
        responses={200: outputs.ExpireOut},
    )
    def post(self, request: Any) -> Response:
        self.body(inputs.EmptyIn)
        result = self.orchestrator.expire_leases()
        return Response(shapes.expire_result(result))


class PruneView(ApiView):
    access = OPERATE
    tags = ("maintenance",)

    @api_schema(
        operation_id="maintenance_prune",
        summary="Delete finished runs and everything of theirs",
        description="Terminal runs only (completed, failed, cancelled) last updated before "
        "older_than, or more than older_than_ms ago; at most limit runs per call.",
        request=inputs.PruneIn,
        responses={200: outputs.PruneOut},
        examples=[
            OpenApiExample(
                "Runs finished more than a week ago",
                request_only=True,
                value={"older_than_ms": 604800000, "statuses": ["completed", "cancelled"]},
            )
        ],
    )
    def post(self, request: Any) -> Response:
        data = self.body(inputs.PruneIn)
        older_than = data.get("older_than")
        if older_than is None:
            older_than = timedelta(milliseconds=data["older_than_ms"])
        result = self.orchestrator.prune_runs(
            older_than=older_than, statuses=data.get("statuses"), limit=data.get("limit")
        )
        return Response(shapes.prune_result(result))
