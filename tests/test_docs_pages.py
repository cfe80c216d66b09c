"""Every page of the documentation (README.md, docs/*.md): its Python blocks paste into the
standard REPL (or compile, for the content of a file)."""

from __future__ import annotations

import pytest

from tests.docs_support import PAGES, REPO, PasteConsole, code_blocks, is_module_file

PYTHON_BLOCKS = [block for page in PAGES for block in code_blocks(page, lang="python")]


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=lambda block: block.where)
def test_python_blocks_paste_into_the_repl(block):
    if is_module_file(block):  # the content of a file: it must compile
        compile(block.text, block.where, "exec")
    else:  # typed into manage.py shell: it must paste (compiled line by line, not run)
        PasteConsole(execute=False).paste(block)


def test_every_page_is_checked():
    assert {block.page for block in PYTHON_BLOCKS} >= {
        REPO / "README.md",
        REPO / "docs" / "howto-rerun.md",
        REPO / "docs" / "django-tasks.md",
        REPO / "docs" / "events.md",
    }
