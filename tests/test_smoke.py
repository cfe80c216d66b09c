from tests.conftest import at, claim, event_types


def test_happy_path(orch, run):
    parse = orch.enqueue_task(run_id=run.id, kind="parse", now=at(0))
    fetch = orch.enqueue_task(run_id=run.id, kind="fetch", depends_on=[parse.id], now=at(0))
    c = claim(orch)
    assert c.task.id == parse.id
    assert claim(orch, "w2") is None
    orch.mark_task_running(task_id=parse.id, lease_id=c.lease.id, worker_id="w1", now=at(2))
    orch.heartbeat_lease(task_id=parse.id, lease_id=c.lease.id, worker_id="w1", now=at(3))
    orch.complete_task(
        task_id=parse.id,
        lease_id=c.lease.id,
        worker_id="w1",
        output={"a": 1},
        next_context={"x": 1},
        now=at(4),
    )
    c2 = claim(orch, now=at(5))
    assert c2.task.id == fetch.id
    orch.complete_task(task_id=fetch.id, lease_id=c2.lease.id, worker_id="w1", now=at(6))
    assert orch.get_run(run_id=run.id).status == "completed"
    print(event_types(orch, run.id))
