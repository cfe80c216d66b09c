"""JSON bodies with a size limit (DRF's JSONParser reads the whole stream, whatever its size)."""

from __future__ import annotations

import json
import math
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser

from .errors import RequestTooLarge
from .settings import api_settings


def _strict_constant(value: str) -> Any:
    raise ValueError(f"{value} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value


class LimitedJSONParser(BaseParser):
    """``application/json`` of at most ``PARALLEL_MCP_API["MAX_BODY_BYTES"]`` bytes (413 above
    it, checked on Content-Length before reading and again while reading); NaN, Infinity and
    numbers that overflow a float are parse errors, as is nesting too deep to decode."""

    media_type = "application/json"

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        parser_context = parser_context or {}
        limit = api_settings.max_body_bytes
        request = parser_context.get("request")
        if request is not None:
            meta = request.META
            try:
                length = int(meta.get("CONTENT_LENGTH") or meta.get("HTTP_CONTENT_LENGTH") or 0)
            except (TypeError, ValueError):
                length = 0
            if length > limit:
                raise RequestTooLarge(limit)
        if stream is None:
            return {}
        raw = stream.read(limit + 1)
        if len(raw) > limit:
            raise RequestTooLarge(limit)
        encoding = parser_context.get("encoding") or settings.DEFAULT_CHARSET
        try:
            "".encode(encoding)  # text codecs only (no bz2_codec bombs)
        except (LookupError, UnicodeError):
            raise ParseError(f'Unsupported charset "{encoding}".') from None
        try:
            text = raw.decode(encoding)
            return json.loads(text, parse_constant=_strict_constant, parse_float=_finite_float)
        except (ValueError, RecursionError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
