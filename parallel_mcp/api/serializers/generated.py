"""DRF serializer classes made from the contract's shapes (``parallel_mcp.contract.shapes``),
so the OpenAPI schema documents exactly what the views return (``SHAPE.dump``). The views never
serialize through them."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from ...contract import shapes


def _field(field: shapes.Field) -> serializers.Field:
    options: dict[str, Any] = {"required": not field.optional}
    if field.nullable:
        options["allow_null"] = True
    if field.help:
        options["help_text"] = field.help
    kind = field.type
    if kind == shapes.NESTED:
        assert field.shape is not None
        return field.shape.serializer()(many=field.many, **options)
    if kind == shapes.UUID_:
        return serializers.UUIDField(**options)
    if kind == shapes.STRING and field.enum:
        return serializers.ChoiceField(choices=list(field.enum), **options)
    if kind == shapes.STRING:
        return serializers.CharField(**options)
    if kind == shapes.INTEGER:
        return serializers.IntegerField(**options)
    if kind == shapes.NUMBER:
        return serializers.FloatField(**options)
    if kind == shapes.BOOLEAN:
        return serializers.BooleanField(**options)
    if kind == shapes.DATETIME:
        return serializers.DateTimeField(**options)
    if kind == shapes.UUIDS:
        return serializers.ListField(child=serializers.UUIDField(), **options)
    return serializers.JSONField(**{**options, "allow_null": True})


def serializer_for(shape: shapes.Shape) -> type[serializers.Serializer]:
    attributes: dict[str, Any] = {field.name: _field(field) for field in shape.fields}
    attributes["__doc__"] = shape.doc or f"A {shape.name.lower()}, as every door shows it."
    attributes["__module__"] = __name__
    return type(shape.name, (serializers.Serializer,), attributes)
