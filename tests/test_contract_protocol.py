"""One set of method signatures: ``Orchestrator`` and ``RemoteOrchestrator`` both implement
``OrchestratorProtocol``, method for method, parameter for parameter."""

from __future__ import annotations

import inspect
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest

from parallel_mcp import Orchestrator, exceptions
from parallel_mcp.contract import protocol
from parallel_mcp.contract.protocol import Id, Json, OrchestratorProtocol, method_names
from parallel_mcp.worker.remote import RemoteError, RemoteOrchestrator

IMPLEMENTATIONS = [Orchestrator, RemoteOrchestrator]


def differences(cls: type) -> list[str]:
    """How ``cls`` departs from the protocol: methods it does not define itself (an inherited
    protocol stub would silently return None), and parameters that differ in name, order,
    kind, default or annotation."""
    found = []
    for name in method_names():
        own = vars(cls).get(name)
        if not inspect.isfunction(own):
            found.append(f"{name}: not defined")
            continue
        expected = protocol.signature(name).parameters
        actual = inspect.signature(own).parameters
        if list(actual) != list(expected):
            found.append(f"{name}: parameters {list(actual)} != {list(expected)}")
            continue
        for param in expected.values():
            mine = actual[param.name]
            for aspect in ("kind", "default", "annotation"):
                if getattr(mine, aspect) != getattr(param, aspect):
                    found.append(
                        f"{name}({param.name}): {aspect} {getattr(mine, aspect)!r} != "
                        f"{getattr(param, aspect)!r}"
                    )
    return found


def test_the_protocol_lists_every_public_method_of_the_orchestrator():
    public = {
        name
        for name, member in inspect.getmembers(Orchestrator, inspect.isfunction)
        if not name.startswith("_")
    }
    # transaction() is local-only: a database transaction cannot span HTTP requests.
    assert public - {"transaction"} == set(method_names())
    assert len(method_names()) == len(set(method_names())) == 32


@pytest.mark.parametrize("cls", IMPLEMENTATIONS, ids=lambda cls: cls.__name__)
def test_both_orchestrators_implement_the_protocol_exactly(cls):
    assert OrchestratorProtocol in cls.__bases__  # declared, so type checkers verify it
    assert differences(cls) == []


def test_every_method_is_keyword_only_and_typed():
    for name in method_names():
        signature = protocol.signature(name)
        assert signature.return_annotation is not inspect.Signature.empty, name
        for param in list(signature.parameters.values())[1:]:
            assert param.kind is inspect.Parameter.KEYWORD_ONLY, (name, param.name)
            assert param.annotation is not inspect.Parameter.empty, (name, param.name)
        assert inspect.getdoc(getattr(OrchestratorProtocol, name)), name


class _Incomplete(OrchestratorProtocol):
    def get_run(self, *, run_id: Id) -> Any:  # as the protocol has it
        return None

    def get_task(self, task_id: Id) -> Any:  # positional
        return None

    def cancel_task(self, *, task_id, reason=None, now=None):  # no annotations
        return None

    def resume_task(self, *, task_id: Id, input: Json = None, reason=None):  # no now
        return None


def test_the_check_names_what_is_missing_or_different():
    found = differences(_Incomplete)
    assert "create_run: not defined" in found  # inherited stubs do not count
    assert any(line.startswith("get_task(task_id): kind") for line in found)
    assert any(line.startswith("cancel_task(task_id): annotation") for line in found)
    assert any(line.startswith("resume_task: parameters") for line in found)
    assert not any(line.startswith("get_run") for line in found)


def test_unset_is_one_object_everywhere():
    from parallel_mcp.mcp import tools
    from parallel_mcp.services import outcomes

    assert outcomes.UNSET is tools.UNSET is protocol.UNSET
    assert repr(protocol.UNSET) == "UNSET"
    assert "input: 'Json' = UNSET" in str(protocol.signature("resume_task"))


# -- what only the remote side refuses ---------------------------------------------------------

NOW = datetime(2026, 1, 1, tzinfo=UTC)
# Nothing listens here: a refusal must come before any request.
UNREACHABLE = "http://127.0.0.1:9/api/pmcp/"


def _placeholder(param: inspect.Parameter) -> Any:
    name = param.name
    if name.endswith("_id") or name == "id":
        return uuid.uuid4()
    if name in ("limit", "progress"):
        return 1
    if name == "older_than":
        return NOW
    if name == "tasks":
        return []
    return "x"


TIMED = [name for name in method_names() if "now" in protocol.signature(name).parameters]


def test_the_time_dependent_methods():
    assert len(TIMED) == 23
    assert {"get_task", "list_runs", "list_events_since"}.isdisjoint(TIMED)


@pytest.mark.parametrize("name", TIMED)
def test_the_remote_refuses_now_before_any_request(name):
    remote = RemoteOrchestrator(base_url=UNREACHABLE, token="pmcp_x_y")
    params = list(protocol.signature(name).parameters.values())[1:]
    arguments = {
        param.name: _placeholder(param)
        for param in params
        if param.default is inspect.Parameter.empty
    }
    with remote, pytest.raises(exceptions.ValidationError) as refused:
        getattr(remote, name)(**arguments, now=NOW)
    assert refused.value.details == {"field": "now"}
    assert "server's clock" in refused.value.message


def test_the_remote_has_no_transaction():
    with RemoteOrchestrator(base_url=UNREACHABLE, token="pmcp_x_y") as remote:
        with pytest.raises(RemoteError, match="needs database access"), remote.transaction():
            pass  # pragma: no cover
