"""JSON bodies with a size limit (DRF's JSONParser reads the whole stream, whatever its size)."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser

from .errors import RequestTooLarge
from .settings import api_settings


def _strict_constant(value: str) -> Any:
    raise ValueError(f"{value} is not valid JSON")


def _bounded_int(text: str) -> int:
    # Python's own limit on the digits of an int, said in our words (its message tells the
    # client to call sys.set_int_max_str_digits()).
    digits = len(text.lstrip("-"))
    if digits > sys.get_int_max_str_digits():
        raise ValueError(
            f"a number has {digits} digits, more than the {sys.get_int_max_str_digits()} allowed"
        )
    return int(text)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # A repeated name would be read as its last value, silently.
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"the name {key!r} appears twice in one object")
            seen.add(key)
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value


class LimitedJSONParser(BaseParser):
    """``application/json`` of at most ``PARALLEL_MCP_API["MAX_BODY_BYTES"]`` bytes (413 above
    it, checked on Content-Length before reading and again while reading); NaN, Infinity and
    numbers that overflow a float are parse errors, as are a name repeated in one object and
    nesting too deep to decode."""

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
            return json.loads(
                text,
                parse_constant=_strict_constant,
                parse_float=_finite_float,
                parse_int=_bounded_int,
                object_pairs_hook=_unique_keys,
            )
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply to decode.") from None
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
