"""Lifecycle extensions: enqueue_tasks (a graph in one all-or-nothing batch)."""

from __future__ import annotations

import itertools
import uuid

import pytest

from parallel_mcp import Orchestrator
from parallel_mcp.exceptions import (
    DependencyCycleError,
    DuplicateTaskKeyError,
    InvalidDependencyError,
    RunTerminalError,
    ValidationError,
)
from parallel_mcp.models import (
    Attempt,
    ContextSnapshot,
    Event,
    Lease,
    Run,
    Task,
    TaskDependency,
)
from tests.conftest import at, live_worker

pytestmark = pytest.mark.django_db


def lease_of(c, worker="w1") -> dict:
    return {"task_id": c.task.id, "lease_id": c.lease.id, "worker_id": worker}


def row_counts() -> dict[str, int]:
    models = (Run, Task, TaskDependency, Attempt, Lease, ContextSnapshot, Event)
    return {model.__name__: model.objects.count() for model in models}


def run_row(run_id) -> dict:
    return Run.objects.filter(pk=run_id).values().get()


def by_key(run) -> dict[str, Task]:
    return {task.key: task for task in Task.objects.filter(run_id=run.id)}


def edges(run) -> set[tuple[str, str, bool]]:
    return set(
        TaskDependency.objects.filter(run_id=run.id).values_list(
            "task__key", "depends_on__key", "required"
        )
    )


def drain(orch, now) -> list[str]:
    """Claim and complete everything claimable, in claim order; return the keys."""
    keys = []
    while (c := orch.claim_next_task(worker_id="w", now=now)) is not None:
        keys.append(c.task.key)
        orch.complete_task(**lease_of(c, "w"), now=now)
    return keys


# -- graphs -----------------------------------------------------------------------------------


def test_keys_reference_tasks_of_the_same_batch(orch, run):
    tasks = orch.enqueue_tasks(
        run_id=run.id,
        tasks=[
            {"kind": "k", "key": "d", "depends_on": ["b", "c"]},
            {"kind": "k", "key": "b", "depends_on": ["a"]},
            {"kind": "k", "key": "c", "depends_on": ["a"]},
            {"kind": "k", "key": "a"},
        ],
        now=at(0),
    )

    assert [task.key for task in tasks] == ["d", "b", "c", "a"]  # the order given
    assert all(task.status == "queued" for task in tasks)
    stored = by_key(run)
    assert {task.id for task in tasks} == {task.id for task in stored.values()}
    assert edges(run) == {
        ("d", "b", True),
        ("d", "c", True),
        ("b", "a", True),
        ("c", "a", True),
    }
    assert set(tasks[0].depends_on_task_ids) == {stored["b"].id, stored["c"].id}
    assert stored["d"].unmet_dependencies == 2
    stored_run = Run.objects.get(pk=run.id)
    assert (stored_run.tasks_total, stored_run.tasks_active, stored_run.status) == (4, 4, "active")
    enqueued = Event.objects.filter(run_id=run.id, event_type="task.enqueued")
    assert enqueued.count() == 4
    payload = enqueued.get(task_id=stored["d"].id).payload
    assert set(payload["depends_on"]) == {str(stored["b"].id), str(stored["c"].id)}

    order = drain(orch, at(1))
    assert order[0] == "a" and order[-1] == "d"
    assert orch.get_run(run_id=run.id).status == "completed"


def test_external_ids_mixed_with_batch_keys_and_optional_entries(orch, run):
    existing = orch.enqueue_task(run_id=run.id, kind="k", key="existing", now=at(0))
    other = orch.enqueue_task(run_id=run.id, kind="k", key="other", now=at(0))
    orch.enqueue_tasks(
        run_id=run.id,
        tasks=[
            {"kind": "k", "key": "a", "depends_on": [existing.id]},
            {
                "kind": "k",
                "key": "b",
                "depends_on": [
                    "a",
                    str(other.id),
                    {"task_id": existing.id, "required": False},
                ],
            },
            {"kind": "k", "key": "c", "depends_on": [{"task_id": "b", "required": False}]},
        ],
        now=at(1),
    )
    assert edges(run) == {
        ("a", "existing", True),
        ("b", "a", True),
        ("b", "other", True),
        ("b", "existing", False),
        ("c", "b", False),
    }
    stored = by_key(run)
    assert stored["b"].unmet_dependencies == 3
    # c runs once b is terminal, even failed.
    c = orch.claim_next_task(worker_id="w", kinds=["k"], now=at(2))
    assert c.task.key == "existing"
    orch.complete_task(**lease_of(c, "w"), now=at(2))
    for expected in ("other", "a", "b"):
        c = orch.claim_next_task(worker_id="w", now=at(3))
        assert c.task.key == expected
        if expected == "b":
            orch.fail_task(**lease_of(c, "w"), error="x", now=at(3))
        else:
            orch.complete_task(**lease_of(c, "w"), now=at(3))
    c = orch.claim_next_task(worker_id="w", now=at(4))
    assert c.task.key == "c"


def test_a_batch_onto_a_failed_external_dependency(orch, run):
    live_worker("k")
    bad = orch.enqueue_task(run_id=run.id, kind="bad", now=at(0))
    orch.enqueue_task(run_id=run.id, kind="keep", now=at(0))
    c = orch.claim_next_task(worker_id="w", kinds=["bad"], now=at(1))
    orch.fail_task(**lease_of(c, "w"), error="x", now=at(1))
    orch.enqueue_tasks(
        run_id=run.id,
        tasks=[
            {"kind": "k", "key": "a", "depends_on": [bad.id]},
            {"kind": "k", "key": "b", "depends_on": ["a"]},
            {"kind": "k", "key": "opt", "depends_on": [{"task_id": bad.id, "required": False}]},
        ],
        now=at(2),
    )
    stored_run = Run.objects.get(pk=run.id)
    assert stored_run.tasks_stuck == 2  # a, and b through a
    assert stored_run.tasks_active == 2  # keep, opt
    assert orch.explain_task(task_id=by_key(run)["opt"].id, now=at(3)) == []


def test_an_empty_batch_returns_an_empty_list(orch, run):
    before = row_counts()
    assert orch.enqueue_tasks(run_id=run.id, tasks=[], now=at(1)) == []
    assert row_counts() == before
    assert orch.get_run(run_id=run.id).status == "pending"


def test_claims_follow_batch_order_for_equal_priority(orch, run):
    keys = [f"t{index:02d}" for index in range(30)]
    shuffled = keys[7:] + keys[:7]
    orch.enqueue_tasks(
        run_id=run.id,
        tasks=[{"kind": "k", "key": key, "priority": 5 if key == "t20" else 0} for key in shuffled],
        now=at(0),
    )
    order = drain(orch, at(1))
    assert order == ["t20", *[key for key in shuffled if key != "t20"]]


def test_explicit_ids_break_ties_by_id(orch, run):
    """Documented (docs/lifecycle.md): equal priority and created_at are ordered by id; ids
    the project generates increase in batch order, ids the caller gives are its business."""
    ids = sorted((uuid.uuid4() for _ in range(5)), reverse=True)
    orch.enqueue_tasks(
        run_id=run.id,
        tasks=[{"kind": "k", "key": f"t{index}", "id": ids[index]} for index in range(5)],
        now=at(0),
    )
    assert drain(orch, at(1)) == [f"t{index}" for index in reversed(range(5))]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)  # one transaction per call, as in production
def test_a_batch_of_2000_tasks_with_a_wide_fan_in():
    orch = Orchestrator()
    run = orch.create_run(now=at(0))
    leaves = [{"kind": "leaf", "key": f"leaf-{index}", "input": index} for index in range(1999)]
    sink = {"kind": "sink", "key": "sink", "depends_on": [leaf["key"] for leaf in leaves]}

    tasks = orch.enqueue_tasks(run_id=run.id, tasks=[*leaves, sink], now=at(0))

    assert len(tasks) == 2000
    stored_run = Run.objects.get(pk=run.id)
    assert (stored_run.tasks_total, stored_run.tasks_active) == (2000, 2000)
    assert TaskDependency.objects.filter(run_id=run.id).count() == 1999
    stored_sink = Task.objects.get(run_id=run.id, key="sink")
    assert stored_sink.unmet_dependencies == 1999
    assert len(stored_sink.depends_on_task_ids) == 1999
    assert Event.objects.filter(run_id=run.id, event_type="task.enqueued").count() == 2000
    assert orch.claim_next_task(worker_id="w", kinds=["sink"], now=at(1)) is None
    # Finish the leaves (in bulk through the API: claim + complete), then the sink runs.
    done = 0
    while (c := orch.claim_next_task(worker_id="w", kinds=["leaf"], now=at(2))) is not None:
        orch.complete_task(**lease_of(c, "w"), now=at(2))
        done += 1
    assert done == 1999
    c = orch.claim_next_task(worker_id="w", now=at(3))
    assert c is not None and c.task.key == "sink"
    orch.complete_task(**lease_of(c, "w"), now=at(3))
    assert orch.get_run(run_id=run.id).status == "completed"


# -- cycles -----------------------------------------------------------------------------------


def assert_names_a_cycle(exc, graph: dict[str, list[str]], members: set[str]) -> None:
    cycle = exc.details["cycle"]
    assert cycle[0] == cycle[-1], cycle
    assert set(cycle) == members, cycle
    assert len(cycle) == len(members) + 1, cycle
    pairs = list(itertools.pairwise(cycle))
    forward = all(b in graph[a] for a, b in pairs)
    backward = all(a in graph[b] for a, b in pairs)
    assert forward or backward, cycle
    for name in members:
        assert name in exc.message


CYCLES = {
    "self-by-key": ({"a": ["a"]}, {"a"}),
    "two": ({"a": ["b"], "b": ["a"]}, {"a", "b"}),
    "three": ({"a": ["b"], "b": ["c"], "c": ["a"]}, {"a", "b", "c"}),
    "with-a-tail": (
        {"root": [], "x": ["root", "p"], "p": ["q"], "q": ["r"], "r": ["p"], "y": ["x"]},
        {"p", "q", "r"},
    ),
    "optional-edge": ({"a": ["b"], "b": ["opt:a"]}, {"a", "b"}),
}


@pytest.mark.parametrize("name", list(CYCLES))
def test_a_cycle_is_refused_naming_it_and_nothing_is_written(orch, run, name):
    graph, members = CYCLES[name]
    orch.enqueue_task(run_id=run.id, kind="k", key="before", now=at(0))
    items = []
    for key, deps in graph.items():
        depends_on = [
            {"task_id": dep[4:], "required": False} if dep.startswith("opt:") else dep
            for dep in deps
        ]
        items.append({"kind": "k", "key": key, "depends_on": depends_on})
    plain_graph = {key: [dep.removeprefix("opt:") for dep in deps] for key, deps in graph.items()}
    before_counts, before_run = row_counts(), run_row(run.id)

    with pytest.raises(DependencyCycleError) as info:
        orch.enqueue_tasks(run_id=run.id, tasks=items, now=at(1))

    assert_names_a_cycle(info.value, plain_graph, members)
    assert row_counts() == before_counts
    assert run_row(run.id) == before_run


def test_a_self_dependency_by_explicit_id_is_a_cycle(orch, run):
    own = uuid.uuid4()
    before = row_counts()
    with pytest.raises(DependencyCycleError) as info:
        orch.enqueue_tasks(
            run_id=run.id,
            tasks=[{"kind": "k", "key": "ok"}, {"kind": "k", "id": own, "depends_on": [own]}],
            now=at(1),
        )
    assert str(own) in info.value.message
    assert str(own) in info.value.details["cycle"]
    assert row_counts() == before


def test_a_cycle_through_explicit_ids_is_named(orch, run):
    a, b = uuid.uuid4(), uuid.uuid4()
    before = row_counts()
    with pytest.raises(DependencyCycleError) as info:
        orch.enqueue_tasks(
            run_id=run.id,
            tasks=[
                {"kind": "k", "id": a, "depends_on": [str(b)]},
                {"kind": "k", "id": b, "key": "b", "depends_on": [a]},
            ],
            now=at(1),
        )
    assert_names_a_cycle(info.value, {str(a): ["b"], "b": [str(a)]}, {str(a), "b"})
    assert row_counts() == before


# -- refusals ---------------------------------------------------------------------------------


def test_duplicate_keys_in_the_batch(orch, run):
    before = row_counts()
    with pytest.raises(DuplicateTaskKeyError) as info:
        orch.enqueue_tasks(
            run_id=run.id,
            tasks=[{"kind": "k", "key": "a"}, {"kind": "k", "key": "b"}, {"kind": "k", "key": "a"}],
            now=at(1),
        )
    assert "'a'" in info.value.message
    assert row_counts() == before


def test_a_key_clashing_with_an_existing_task(orch, run):
    orch.enqueue_task(run_id=run.id, kind="k", key="taken", now=at(0))
    before = row_counts()
    with pytest.raises(DuplicateTaskKeyError) as info:
        orch.enqueue_tasks(
            run_id=run.id,
            tasks=[{"kind": "k", "key": "fresh"}, {"kind": "k", "key": "taken"}],
            now=at(1),
        )
    assert "taken" in info.value.message
    assert row_counts() == before


def test_the_same_key_in_another_run_is_fine(orch, run):
    other = orch.create_run(now=at(0))
    orch.enqueue_task(run_id=other.id, kind="k", key="a", now=at(0))
    [task] = orch.enqueue_tasks(run_id=run.id, tasks=[{"kind": "k", "key": "a"}], now=at(1))
    assert task.run_id == run.id


@pytest.mark.parametrize(
    "bad",
    [
        {"kind": ""},
        {"kind": "k", "priority": "high"},
        {"kind": "k", "max_attempts": 0},
        {"kind": "k", "timeout_ms": -5},
        {"kind": "k", "retry": {"backoff": "random"}},
        {"kind": "k", "input": {1, 2}},
        {"kind": "k", "id": "not-a-uuid"},
        {"kind": "k", "not_before": "tomorrow"},
    ],
    ids=lambda bad: ",".join(f"{k}={v!r}" for k, v in bad.items()),
)
def test_a_bad_item_is_refused_naming_its_position(orch, run, bad):
    before = row_counts()
    with pytest.raises(ValidationError) as info:
        orch.enqueue_tasks(
            run_id=run.id,
            tasks=[{"kind": "k", "key": "a"}, {"kind": "k", "key": "b"}, bad],
            now=at(1),
        )
    assert info.value.details["position"] == 2
    assert "tasks[2]" in info.value.message
    assert row_counts() == before


@pytest.mark.parametrize(
    "bad",
    [
        "not a dict",
        {"kind": "k", "colour": "red"},
        {"kind": "k", "depends_on": "a"},
        {"kind": "k", "depends_on": [{"task_id": "a", "required": "no"}]},
    ],
    ids=["not-a-dict", "unknown-argument", "depends_on-not-a-list", "required-not-bool"],
)
def test_every_bad_item_names_its_position(orch, run, bad):
    before = row_counts()
    with pytest.raises(ValidationError) as info:
        orch.enqueue_tasks(
            run_id=run.id,
            tasks=[{"kind": "k", "key": "a"}, {"kind": "k", "key": "b"}, bad],
            now=at(1),
        )
    assert row_counts() == before
    assert info.value.details.get("position") == 2
    assert "tasks[2]" in info.value.message


@pytest.mark.parametrize(
    "depends_on",
    [["nowhere"], [str(uuid.uuid4())], [{"task_id": "nowhere", "required": False}]],
    ids=["unknown-key", "unknown-id", "unknown-optional"],
)
def test_an_unknown_dependency_is_refused_naming_it(orch, run, depends_on):
    before = row_counts()
    entry = depends_on[0]
    name = entry["task_id"] if isinstance(entry, dict) else entry
    with pytest.raises(InvalidDependencyError, match=name):
        orch.enqueue_tasks(
            run_id=run.id,
            tasks=[{"kind": "k", "key": "a"}, {"kind": "k", "key": "b", "depends_on": depends_on}],
            now=at(1),
        )
    assert row_counts() == before


def test_a_dependency_on_a_key_of_an_earlier_batch_is_not_a_batch_key(orch, run):
    orch.enqueue_tasks(run_id=run.id, tasks=[{"kind": "k", "key": "first"}], now=at(0))
    before = row_counts()
    with pytest.raises(InvalidDependencyError):
        orch.enqueue_tasks(
            run_id=run.id, tasks=[{"kind": "k", "key": "second", "depends_on": ["first"]}]
        )
    assert row_counts() == before


def test_a_foreign_dependency_is_refused(orch, run):
    other = orch.create_run(now=at(0))
    foreign = orch.enqueue_task(run_id=other.id, kind="k", now=at(0))
    before = row_counts()
    with pytest.raises(InvalidDependencyError):
        orch.enqueue_tasks(
            run_id=run.id, tasks=[{"kind": "k", "depends_on": [foreign.id]}], now=at(1)
        )
    assert row_counts() == before


def test_a_duplicate_dependency_entry_is_refused(orch, run):
    before = row_counts()
    with pytest.raises(InvalidDependencyError):
        orch.enqueue_tasks(
            run_id=run.id,
            tasks=[
                {"kind": "k", "key": "a"},
                {"kind": "k", "key": "b", "depends_on": ["a", {"task_id": "a", "required": False}]},
            ],
            now=at(1),
        )
    assert row_counts() == before


@pytest.mark.parametrize("tasks", ["abc", {"kind": "k"}, 42, None])
def test_tasks_must_be_a_list(orch, run, tasks):
    with pytest.raises(ValidationError):
        orch.enqueue_tasks(run_id=run.id, tasks=tasks, now=at(1))


def test_enqueue_tasks_into_a_terminal_run(orch, run):
    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    orch.cancel_run(run_id=run.id, now=at(1))
    before = row_counts()
    with pytest.raises(RunTerminalError):
        orch.enqueue_tasks(run_id=run.id, tasks=[{"kind": "k"}], now=at(2))
    assert row_counts() == before


def test_enqueue_tasks_moves_a_completed_run_back_to_active(orch, run):
    assert orch.get_run(run_id=run.id).status == "pending"
    orch.enqueue_tasks(run_id=run.id, tasks=[{"kind": "k", "key": "a"}], now=at(0))
    assert orch.get_run(run_id=run.id).status == "active"
    changes = [
        e.payload for e in Event.objects.filter(run_id=run.id, event_type="run.status.changed")
    ]
    assert changes == [{"from": "pending", "to": "active"}]


@pytest.mark.slow
def test_a_full_batch_with_a_tree_is_written_whole(orch, django_capture_on_commit_callbacks):
    """MAX_BATCH tasks in one call: more rows than one statement may carry on SQLite (the
    inserts of tasks, edges and events are cut below its parameter limit), all committed
    together, each with its event and its edge; the event signal gets every event with the
    id it was stored under, across the chunks."""
    from parallel_mcp.contract.limits import MAX_BATCH
    from parallel_mcp.signals import event_recorded

    run = orch.create_run()
    specs = [
        {"kind": "k", "key": f"t{i}", **({"depends_on": [f"t{(i - 1) // 2}"]} if i else {})}
        for i in range(MAX_BATCH)
    ]
    signalled: list = []
    last = Event.objects.order_by("id").last()

    def receiver(sender, event, **kwargs):
        signalled.append(event)

    event_recorded.connect(receiver)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            tasks = orch.enqueue_tasks(run_id=run.id, tasks=specs)
    finally:
        event_recorded.disconnect(receiver)
    stored = Event.objects.filter(id__gt=last.id).order_by("id")
    assert [(e.id, e.task_id, e.event_type) for e in signalled] == list(
        stored.values_list("id", "task_id", "event_type")
    )
    assert [task.key for task in tasks] == [spec["key"] for spec in specs]
    assert Task.objects.filter(run_id=run.id).count() == MAX_BATCH
    assert TaskDependency.objects.filter(run_id=run.id).count() == MAX_BATCH - 1
    assert Event.objects.filter(run_id=run.id, event_type="task.enqueued").count() == MAX_BATCH
    assert list(Task.objects.filter(run_id=run.id, unmet_dependencies=0).values_list("key")) == [
        ("t0",)
    ]
    run.refresh_from_db()
    assert (run.tasks_total, run.tasks_active) == (MAX_BATCH, MAX_BATCH)


def test_a_clash_with_a_stored_id_or_key_writes_nothing(orch):
    """The insert skips a row whose id (of any run) or key (of the run) is taken, and the
    whole batch is refused with the clash named."""
    from parallel_mcp.exceptions import DuplicateIdError

    run, other = orch.create_run(), orch.create_run()
    taken = orch.enqueue_task(run_id=other.id, kind="k")
    orch.enqueue_task(run_id=run.id, kind="k", key="taken")
    before = row_counts()
    fresh = [{"kind": "k", "key": f"new-{n}"} for n in range(3)]
    with pytest.raises(DuplicateIdError) as raised:
        orch.enqueue_tasks(run_id=run.id, tasks=[*fresh, {"kind": "k", "id": str(taken.id)}])
    assert raised.value.details["task_id"] == str(taken.id)
    with pytest.raises(DuplicateTaskKeyError) as raised_key:
        orch.enqueue_tasks(run_id=run.id, tasks=[*fresh, {"kind": "k", "key": "taken"}])
    assert raised_key.value.details["key"] == "taken"
    with pytest.raises(DuplicateTaskKeyError):
        orch.enqueue_task(run_id=run.id, kind="k", key="taken")
    assert row_counts() == before


def test_each_task_of_a_batch_keeps_its_own_values(orch, run):
    """A batch inserts the values its tasks share once and the others per task (one JSON
    parameter on both databases): every kind of value comes back as it was given."""
    from parallel_mcp.models import Task

    inputs = [None, "text", '{"not": "parsed"}', 0, -3, 2.5, True, [], {}, {"a": [1, None, "é"]}]
    specs = [
        {
            "kind": f"k{index % 3}",
            "key": f"v{index}",
            "priority": index % 2,
            "input": value,
            "metadata": {"n": index} if index % 2 else None,
            "max_attempts": None if index % 4 else 3,
            "not_before": at(index) if index % 5 == 0 else None,
        }
        for index, value in enumerate(inputs)
    ]
    created = orch.enqueue_tasks(run_id=run.id, tasks=specs, now=at(0))
    stored = {task.key: task for task in Task.objects.filter(run_id=run.id)}
    for spec, task in zip(specs, created, strict=True):
        row = stored[spec["key"]]
        for name in ("kind", "priority", "input", "metadata", "max_attempts", "not_before"):
            assert getattr(row, name) == spec[name] == getattr(task, name), (name, spec)
        assert (row.status, row.claimable, row.unmet_dependencies) == ("queued", True, 0)


@pytest.mark.parametrize("enabled", [True, False])
def test_a_batch_is_built_and_written_without_garbage_collections(orch, run, enabled):
    """Every object a batch makes lives until the call returns, so the collections its
    allocations set off free nothing: enqueue_tasks holds the collector off (a fifth of the
    CPU of 10,000 tasks, bench/FINDINGS.md) and gives it back as it found it, after an error
    too."""
    import gc

    started = []

    def seen(phase, info):
        if phase == "start":
            started.append(info["generation"])

    specs = [{"kind": "k", "key": f"t{i}", "input": {"n": [i]}} for i in range(3_000)]
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    gc.collect()  # the counts start from zero: the collections seen are the batch's
    gc.callbacks.append(seen)
    try:
        orch.enqueue_tasks(run_id=run.id, tasks=specs)
        # At most the young collection the collector runs as soon as it is back on (63
        # collections of every generation while the batch was built and written, before).
        assert len(started) <= (1 if enabled else 0)
        assert gc.isenabled() is enabled
        with pytest.raises(DependencyCycleError):
            orch.enqueue_tasks(
                run_id=run.id, tasks=[{"kind": "k", "key": "a", "depends_on": ["a"]}]
            )
        with pytest.raises(DuplicateTaskKeyError):  # refused inside the write
            orch.enqueue_tasks(run_id=run.id, tasks=[{"kind": "k", "key": "t0"}])
        assert gc.isenabled() is enabled
    finally:
        gc.callbacks.remove(seen)
        (gc.enable if was else gc.disable)()
    assert Task.objects.filter(run_id=run.id).count() == 3_000
