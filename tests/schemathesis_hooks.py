"""schemathesis hooks and checks of the API fuzz run (``hooks`` in tests/schemathesis.toml).

* ``filter_failure``: a schema-valid request may still be refused with 400 for a reason that
  depends on stored data (an id that must exist, a graph without cycles, a cursor the list
  handed out). No schema can express those; the API's schema lists them for each operation
  under its 400 response as ``x-pmcp-data-refusals`` (parallel_mcp.api.schema.DATA_REFUSALS).
  Such a 400 is an answer the schema documents, not a rejected positive case: the hook drops
  exactly those ``positive_data_acceptance`` failures, matching the error's code (and
  ``details.field`` when the refusal names one). Every other failure is kept.
* ``error_envelope``: every refusal of the API is the JSON error envelope, whatever the input
  (the HTTP server's own 414 aside, which the schema documents without a body).

The run uses several worker threads (tests/schemathesis.toml: it waits on the server most of
the time). Hypothesis describes lambdas with ``ast.parse``, which CPython 3.11 cannot run in
two threads at once ("SystemError: AST constructor recursion depth mismatch"): it is
serialized here.
"""

from __future__ import annotations

import ast
import json
import threading
from typing import Any

import schemathesis
from schemathesis.openapi.checks import RejectedPositiveData

_ast_parse = ast.parse
_ast_lock = threading.Lock()


def _serialized_parse(*args: Any, **kwargs: Any) -> Any:
    with _ast_lock:
        return _ast_parse(*args, **kwargs)


ast.parse = _serialized_parse  # type: ignore[assignment]


def documented_data_refusal(operation_definition: dict[str, Any], status: int, body: Any) -> bool:
    """Whether a response is one of the data-dependent 400s the operation documents."""
    if status != 400 or not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        return False
    error = body["error"]
    details = error.get("details") if isinstance(error.get("details"), dict) else {}
    response = operation_definition.get("responses", {}).get("400", {})
    for refusal in response.get("x-pmcp-data-refusals", []):
        if error.get("code") != refusal["code"]:
            continue
        if "field" in refusal and details.get("field") != refusal["field"]:
            continue
        return True
    return False


@schemathesis.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    if not isinstance(failure, RejectedPositiveData):
        return True
    try:
        body = json.loads(response.content)
    except ValueError:
        return True
    definition = case.operation.definition.raw
    return not documented_data_refusal(definition, response.status_code, body)


@schemathesis.check
def error_envelope(ctx: Any, response: Any, case: Any) -> bool | None:
    if response.status_code < 400:
        return None
    content_type = (response.headers.get("content-type") or [""])[0]
    if response.status_code == 414 and not content_type.startswith("application/json"):
        return None  # the HTTP server's own answer to an over-long request line
    assert content_type.startswith("application/json"), (response.status_code, content_type)
    body = json.loads(response.content)
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "details"}, body
    assert isinstance(body["error"]["code"], str) and isinstance(body["error"]["details"], dict)
    return True
