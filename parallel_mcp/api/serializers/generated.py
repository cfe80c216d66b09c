"""DRF serializer classes made from the contract's shapes (``parallel_mcp.contract.shapes``),
so the OpenAPI schema documents exactly what the views return (``SHAPE.dump``). The views never
serialize through them."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from ...contract import shapes


class ShapeField(serializers.Field):
    """A field of a contract shape; the OpenAPI schema shows the shape's own JSON Schema for it
    (api/schema.py), the one the MCP output schemas carry."""

    def __init__(self, shape_field: shapes.Field, **kwargs: Any) -> None:
        self.shape_field = shape_field
        super().__init__(**kwargs)

    def to_representation(self, value: Any) -> Any:
        return value


def _field(field: shapes.Field) -> serializers.Field:
    options: dict[str, Any] = {"required": not field.optional}
    if field.nullable:
        options["allow_null"] = True
    if field.help:
        options["help_text"] = field.help
    if field.type == shapes.NESTED:
        assert field.shape is not None
        return field.shape.serializer()(many=field.many, **options)
    return ShapeField(field, **options)


def serializer_for(shape: shapes.Shape) -> type[serializers.Serializer]:
    attributes: dict[str, Any] = {field.name: _field(field) for field in shape.fields}
    attributes["__doc__"] = shape.doc or f"A {shape.name.lower()}, as every door shows it."
    attributes["__module__"] = __name__
    return type(shape.name, (serializers.Serializer,), attributes)
