"""Each event type is built in exactly one place of the service layer (issue 15): two places
building the same event drift apart (payload keys, attempt ids) and no other test sees it."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import parallel_mcp.services
from parallel_mcp.admin.events import EVENT_TYPES

SERVICES = Path(parallel_mcp.services.__file__).parent


def event_calls() -> dict[str, list[str]]:
    """Every ``….event("type", …)`` call in services/, as type -> ["file:line", …]; an
    f-string type (``f"task.{status}"``) is kept as its pattern."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(SERVICES.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "event"
                and node.args
            ):
                continue
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                name = first.value
            elif isinstance(first, ast.JoinedStr):
                name = ast.unparse(first)
            else:
                raise AssertionError(f"{path.name}:{node.lineno}: event type is not a literal")
            found[name].append(f"{path.name}:{node.lineno}")
    return found


def test_each_event_type_is_built_in_one_place():
    repeated = {name: places for name, places in event_calls().items() if len(places) > 1}
    assert repeated == {}


def test_the_services_build_every_documented_event_type_and_no_other():
    built = set(event_calls())
    # The pause event is built once for both pause states.
    assert "f'task.{status}'" in built
    built = (built - {"f'task.{status}'"}) | {"task.blocked", "task.waiting_input"}
    assert built == set(EVENT_TYPES)
