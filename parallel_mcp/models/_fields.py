"""Small shared pieces for model definitions."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import models

from ..ids import new_id


def uuid_pk() -> models.UUIDField:
    return models.UUIDField(primary_key=True, default=new_id, editable=False)


def status_choices(values: Iterable[str]) -> list[tuple[str, str]]:
    return [(value, value.replace("_", " ")) for value in values]


def status_check(field: str, values: Iterable[str], name: str) -> models.CheckConstraint:
    return models.CheckConstraint(
        condition=models.Q(**{f"{field}__in": sorted(values)}),
        name=name,
    )
