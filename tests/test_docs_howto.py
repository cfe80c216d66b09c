"""docs/howto-rerun.md, pasted block by block into one REPL session on a fresh database, as the
page says to: every block pastes and runs, and prints what the page shows."""

from __future__ import annotations

from unittest import mock

import pytest

from parallel_mcp.worker.registry import registry
from tests.docs_support import REPO, code_blocks, paste_all

pytestmark = pytest.mark.django_db

PAGE = REPO / "docs" / "howto-rerun.md"


@pytest.fixture
def blocks():
    """The page's Python blocks; its ``@handler`` block registers into the default registry,
    so the registry is put back afterwards."""
    found = code_blocks(PAGE, lang="python")
    assert len(found) >= 10
    with (
        mock.patch.object(registry, "_handlers", dict(registry._handlers)),
        mock.patch.object(registry, "_origins", dict(registry._origins)),
    ):
        yield found


def test_every_block_pastes_into_the_repl_and_runs(blocks):
    paste_all(blocks, {})


def test_every_block_prints_what_the_page_shows(blocks):
    paste_all(blocks, {}, check_output=True)
