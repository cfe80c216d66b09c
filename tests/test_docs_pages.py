"""Every page of the documentation (README.md, docs/*.md): its Python blocks paste into the
standard REPL (or compile, for the content of a file), its links lead somewhere, the index lists
every page, and no page promises for later what exists."""

from __future__ import annotations

import re
import shlex
import tomllib

import pytest

from tests.docs_support import (
    PAGES,
    REPO,
    PasteConsole,
    anchors,
    code_blocks,
    is_module_file,
    links,
)

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


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_links_lead_to_files_and_headings_that_exist(page):
    broken = []
    for number, target in links(page):
        if re.match(r"[a-z]+:", target):  # https:, mailto: …: not checked (no network)
            continue
        path, _, anchor = target.partition("#")
        goal = (page.parent / path).resolve() if path else page
        if not goal.exists():
            broken.append(f"{page.name}:{number}: {target} (no such file)")
        elif anchor and goal.suffix == ".md" and anchor not in anchors(goal):
            broken.append(f"{page.name}:{number}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_index_lists_every_page():
    index = REPO / "docs" / "README.md"
    listed = {(index.parent / target).resolve() for _, target in links(index)}
    pages = {page.resolve() for page in (REPO / "docs").glob("*.md") if page != index}
    assert pages - listed == set()


# Words that promise something for later. What they promise exists now, or the page says
# so in the present tense; a true "not yet" is written without them.
PROMISE = re.compile(
    r"\((?:later|soon|coming soon)\)|\bcomes? (?:later|with the \w+ work)"
    r"|\buntil [^.()]*\b(?:is|are) added\b|\bcoming soon\b|\bwill be added\b",
    re.IGNORECASE,
)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_no_page_promises_for_later(page):
    text = re.sub(r"\s+", " ", page.read_text())
    assert PROMISE.findall(text) == []


def test_pip_installs_name_what_pip_can_find():
    """parallel-mcp is not on PyPI: every page installs it from a checkout or a built wheel,
    and the wheel's file name is the one the checkout's pyproject.toml builds."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wheel = f"{project['name'].replace('-', '_')}-{project['version']}-py3-none-any.whl"
    installs = [
        (block.where, line.split("#")[0].strip())
        for page in PAGES
        for block in code_blocks(page)
        if block.lang in ("sh", "bash", "")
        for line in block.text.splitlines()
        if "pip install" in line
    ]
    assert len(installs) >= 5
    for where, line in installs:
        for requirement in shlex.split(line.split("pip install", 1)[1]):
            if requirement.startswith("-") or not re.match(r"parallel[-_]mcp", requirement):
                continue
            raise AssertionError(f"{where}: {line} (not on PyPI)")
        for named in re.findall(r"parallel_mcp-[^\s'\"\[]+\.whl", line):
            assert named.endswith(wheel), f"{where}: {named} is not {wheel}"
    assert any(wheel in line for _, line in installs)
