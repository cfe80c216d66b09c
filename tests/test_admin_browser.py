"""End to end in a real browser: Playwright (sync API) driving Debian's Chromium against the
live test server.

Log in, open a finished demo-like run, see its task graph, open the failed task, re-execute it
with its dependents through the action, watch its status change (failed -> queued -> completed
once a worker finishes it), and take screenshots that must exist and be non-empty.

Chromium is ``/usr/bin/chromium`` (Debian package ``chromium``). Without it the test is skipped,
except under ``CI=true``, where it fails. ``PMCP_ADMIN_SCREENSHOTS=<dir>`` also copies the
screenshots there (``docs/images`` holds the ones docs/admin.md shows).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from django.db import connections

from parallel_mcp import Orchestrator
from tests.admin_support import PASSWORD, complete, make_user, seed_fanout_run

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
IN_CI = os.environ.get("CI", "").strip().lower() == "true"
# The screenshots docs/admin.md shows (PMCP_ADMIN_SCREENSHOTS copies these).
DOCS_SCREENSHOTS = {
    "admin-runs.png",
    "admin-run.png",
    "admin-graph.png",
    "admin-task-failed.png",
    "admin-confirm-retry.png",
    "admin-task-requeued.png",
    "admin-dead-letter.png",
}

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _require_browser():
    if not os.path.exists(CHROMIUM):
        message = f"{CHROMIUM} is missing (Debian: apt-get install -y chromium)"
        if IN_CI:
            pytest.fail(f"{message}; the browser test must run under CI=true.")
        pytest.skip(message)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:  # pragma: no cover - the test extra installs it
        if IN_CI:
            pytest.fail("playwright is not installed (pip install -e '.[test]').")
        pytest.skip("playwright is not installed")
    return sync_playwright


@pytest.fixture
def screenshots(tmp_path):
    directory = tmp_path / "screenshots"
    directory.mkdir()
    yield directory
    target = os.environ.get("PMCP_ADMIN_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        for shot in directory.glob("*.png"):
            if shot.name in DOCS_SCREENSHOTS:
                shutil.copy(shot, Path(target) / shot.name)


def test_operator_re_executes_a_failed_task_in_the_browser(live_server, screenshots, monkeypatch):
    sync_playwright = _require_browser()
    # The Playwright sync API runs an event loop in this thread; the ORM calls made here
    # (seeding, playing the worker) are plain synchronous calls between page loads.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

    orch = Orchestrator()
    seeded = seed_fanout_run(orch, fetches=6)
    run, tasks = seeded["run"], seeded["tasks"]
    failed = tasks["fetch-6"]
    assert run.status == "failed" and failed.status == "failed"
    make_user("superuser", "admin")
    shots: list[Path] = []

    def shot(page, name: str, **kwargs) -> None:
        path = screenshots / f"admin-{name}.png"
        page.screenshot(path=str(path), **kwargs)
        shots.append(path)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.set_default_timeout(20_000)

            # log in
            page.goto(f"{live_server.url}/admin/login/?next=/admin/")
            page.fill("#id_username", "admin")
            page.fill("#id_password", PASSWORD)
            page.click("input[type=submit]")
            page.wait_for_selector("#site-name")
            assert "Parallel MCP" in page.content()

            # the runs list: the demo run, its status and counts
            page.goto(f"{live_server.url}/admin/parallel_mcp/run/")
            row = page.locator("#result_list tbody tr").first
            assert "failed" in row.inner_text()
            assert "demo-1" in row.inner_text()
            shot(page, "runs")

            # the run: graph with one node per task
            row.locator("th a").first.click()
            page.wait_for_selector("svg.pmcp-graph")
            assert page.locator("svg.pmcp-graph g.pmcp-node").count() == len(tasks)
            assert page.locator("svg.pmcp-graph").get_attribute("data-nodes") == str(len(tasks))
            assert page.locator("svg.pmcp-graph g.pmcp-node.pmcp-status-failed").count() == 2
            assert page.locator("svg.pmcp-graph path.pmcp-edge").count() == 12
            shot(page, "run", full_page=True)
            graph_box = page.locator(".pmcp-graph-frame")
            graph_box.screenshot(path=str(screenshots / "admin-graph.png"))
            shots.append(screenshots / "admin-graph.png")

            # open the failed task from its node in the graph
            page.locator(f'svg.pmcp-graph g.pmcp-node[data-task-id="{failed.id}"]').click()
            page.wait_for_selector("text=Why isn't this running?")
            assert page.locator(".field-status_display .pmcp-badge").inner_text() == "failed"
            assert "ConnectionError: upstream timed out" in page.content()
            shot(page, "task-failed", full_page=True)

            # re-execute it with its dependents: the action, then its confirmation page
            page.click("button[data-action=retry_tasks_cascade]")
            page.wait_for_selector("text=Re-execute tasks and their dependents")
            assert "fetch-6" in page.locator("table.pmcp-selection").inner_text()
            page.fill("#id_note", "upstream is back")
            shot(page, "confirm-retry", full_page=True)
            page.click("input[type=submit][name=confirm]")
            page.wait_for_selector("ul.messagelist li.success")
            assert "re-executed" in page.locator("ul.messagelist").inner_text()
            assert page.locator(".field-status_display .pmcp-badge").inner_text() == "queued"
            shot(page, "task-requeued", full_page=True)

            # a worker picks it up and completes it; the page shows the new status
            complete(orch, orch.get_task(task_id=failed.id), output={"words": 42})
            # Inside the Playwright block this thread runs in another context (greenlet), so
            # that call opened its own connection: close it, or it outlives the test database.
            connections.close_all()
            page.reload()
            assert page.locator(".field-status_display .pmcp-badge").inner_text() == "completed"
            assert "task.requeued" in page.content()
            # the requeue recorded the operator in the event payload
            assert "admin: admin: upstream is back" in page.content()

            # the run: aggregate is no longer stuck (queued, ready to run)
            page.goto(f"{live_server.url}/admin/parallel_mcp/run/{run.id}/change/")
            aggregate = page.locator(
                f'svg.pmcp-graph g.pmcp-node[data-task-id="{tasks["aggregate"].id}"]'
            )
            assert aggregate.get_attribute("data-status") == "queued"
            assert "pmcp-node-stuck" not in (aggregate.get_attribute("class") or "")
            shot(page, "run-after", full_page=True)

            # the dead-letter view, with the failure reason
            page.goto(f"{live_server.url}/admin/parallel_mcp/task/?dead=yes")
            assert "simulated network blip" in page.locator("#result_list").inner_text()
            shot(page, "dead-letter")
        finally:
            browser.close()

    for path in shots:
        assert path.exists(), path
        assert path.stat().st_size > 1_000, path
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path


def test_missing_chromium_skips_locally(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM", "/nonexistent/chromium")
    monkeypatch.setattr(sys.modules[__name__], "IN_CI", False)
    with pytest.raises(pytest.skip.Exception):
        _require_browser()


def test_missing_chromium_fails_under_ci(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM", "/nonexistent/chromium")
    monkeypatch.setattr(sys.modules[__name__], "IN_CI", True)
    with pytest.raises(pytest.fail.Exception):
        _require_browser()
