"""Checking what the documentation shows, by running it.

- :func:`code_blocks` reads the fenced code blocks of README.md and docs/*.md, with the
  headings they sit under.
- :class:`PasteConsole` feeds a Python block to the standard REPL (``code.InteractiveConsole``,
  which ``manage.py shell`` uses without IPython) line by line, as a paste would, and fails on a
  syntax error or an exception. It can also compare what an expression prints with the ``# …``
  comment lines the page shows under it.
- :func:`example_env`, :func:`manage` and :func:`live_server` run the example project as a user
  of a checkout would: its own settings, its own SQLite file, a real ``runserver``.
- :func:`run_bash` runs shell blocks with ``python`` meaning the interpreter of the tests.
"""

from __future__ import annotations

import ast
import code
import contextlib
import io
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "example_project"
MANAGE = EXAMPLE / "manage.py"
PAGES = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<info>[^`\s]*)")
_HEADING = re.compile(r"^(?P<level>#{1,6})\s+(?P<title>.+?)\s*#*\s*$")


# -- reading pages ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    headings: tuple[str, ...]  # the enclosing headings, outermost first

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def first_line(self) -> str:
        return self.text.split("\n", 1)[0].strip()


def code_blocks(page: Path, *, lang: str | None = None, section: str | None = None) -> list[Block]:
    """The fenced blocks of ``page`` (of one language, under one heading at any level)."""
    blocks: list[Block] = []
    headings: list[tuple[int, str]] = []
    lines = page.read_text().splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        fence = _FENCE.match(line)
        if fence is None:
            heading = _HEADING.match(line)
            if heading:
                level = len(heading["level"])
                headings = [h for h in headings if h[0] < level] + [(level, heading["title"])]
            index += 1
            continue
        indent, marker = len(fence["indent"]), fence["fence"]
        body: list[str] = []
        start = index + 1
        index += 1
        while index < len(lines) and not lines[index].strip().startswith(marker):
            text = lines[index]
            body.append(text[indent:] if text[:indent].strip() == "" else text)
            index += 1
        index += 1  # the closing fence
        blocks.append(
            Block(
                page=page,
                line=start,
                lang=fence["info"].lower(),
                text="\n".join(body),
                headings=tuple(title for _, title in headings),
            )
        )
    return [
        block
        for block in blocks
        if (lang is None or block.lang == lang) and (section is None or section in block.headings)
    ]


def is_module_file(block: Block) -> bool:
    """A block that is the content of a file (it starts with ``# path/to/file.py``), not
    something to type into a shell."""
    return bool(re.match(r"#\s*[\w./-]+\.py\b", block.first_line))


# -- pasting into the REPL ----------------------------------------------------------------------
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_ENUM_REPR = re.compile(r"<\w+\.\w+: ('[^']*')>")


def shorten_ids(text: str) -> str:
    """What the pages print for an id (``01a2…``), and a ``str`` enum as its value."""
    return _ENUM_REPR.sub(r"\1", _UUID.sub("01a2…", text))


def _squeeze(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _value(text: str) -> Any:
    """A printed line as a comparable value: ``words {literal}`` becomes ``(words, literal)``,
    so that dicts compare whatever their key order (PostgreSQL's jsonb reorders keys)."""
    text = _squeeze(text)
    for start in [0, *(m.start() for m in re.finditer(r"[\[{(]", text))]:
        try:
            return text[:start].strip(), ast.literal_eval(text[start:])
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return text, None


def same_output(printed: str, shown: str) -> bool:
    """Whether ``printed`` reads as the comment lines ``shown`` (one value per printed line;
    a value the page wraps over several lines is one line)."""
    if _value(printed) == _value(shown):
        return True
    lines = [line for line in printed.splitlines() if line.strip()]
    page = [line for line in shown.splitlines() if line.strip()]
    return len(lines) == len(page) and all(map(lambda a, b: _value(a) == _value(b), lines, page))


class PasteConsole(code.InteractiveConsole):
    """``code.InteractiveConsole`` that records errors instead of printing them.

    ``execute=False`` only compiles what is pasted: it proves a block pastes without running it.
    """

    def __init__(self, namespace: dict[str, Any] | None = None, *, execute: bool = True) -> None:
        super().__init__(namespace if namespace is not None else {}, filename="<console>")
        self.execute = execute
        self.errors: list[str] = []

    def runcode(self, code_object: Any) -> None:
        if self.execute:
            super().runcode(code_object)

    def showsyntaxerror(self, filename: str | None = None, **kwargs: Any) -> None:
        self.errors.append(traceback.format_exc(limit=0))

    def showtraceback(self) -> None:
        self.errors.append(traceback.format_exc())

    def paste(
        self,
        block: Block,
        *,
        check_output: bool = False,
        normalize: Callable[[str], str] = shorten_ids,
    ) -> str:
        """Push every line of ``block`` as a paste would, then an empty line (Enter); return
        what it printed. Fails on the first syntax error or exception.

        With ``check_output``, the comment lines right under a statement (or, for a compound
        statement, inside it at column 0) are what the page says it prints: when the statement
        printed something, it must read the same after ``normalize``, whitespace squeezed."""
        printed: list[str] = []
        last: tuple[int, str] | None = None  # the last statement run: its line and output
        shown: list[str] = []  # comment lines under it
        inside: list[str] = []  # comment lines at column 0 inside the statement being typed
        collecting = False

        def settle() -> None:
            if not (check_output and last and last[1].strip() and shown):
                return
            page = "\n".join(line.lstrip("#") for line in shown)
            assert same_output(normalize(last[1]), page), (
                f"{block.where} (+{last[0]}): the page shows\n{page}\n"
                f"but the console printed\n{last[1]}"
            )

        for number, line in enumerate([*block.text.split("\n"), ""], start=1):
            typing = bool(self.buffer)
            if line.startswith("#"):
                if typing:
                    inside.append(line)
                elif collecting:
                    shown.append(line)
                    continue
            if not line.strip() and not typing:
                collecting = False
                continue
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                more = self.push(line)
            if self.errors:
                raise AssertionError(
                    f"{block.where} (+{number}): pasting {line!r} into the REPL failed:\n"
                    + "\n".join(self.errors)
                )
            printed.append(out.getvalue())
            if not more and not line.startswith("#"):  # a statement ran
                settle()
                last, shown, inside, collecting = (number, out.getvalue()), inside, [], True
        settle()
        return "".join(printed)


def paste_all(blocks: list[Block], namespace: dict[str, Any], **options: Any) -> str:
    """Paste blocks in order into one console (one shell session)."""
    console = PasteConsole(namespace)
    return "".join(console.paste(block, **options) for block in blocks)


# -- the example project as a process -----------------------------------------------------------
def example_env(database: Path, **extra: str) -> dict[str, str]:
    """The environment of a user running the example project of a checkout on ``database``:
    none of the test suite's settings, ``python`` on PATH being this interpreter."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key
        not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "PMCP_DB_NAME", "DJANGO_DEBUG", "CI")
        and not key.startswith("DJANGO_")
    }
    env["PMCP_SQLITE_PATH"] = str(database)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.update(extra)
    return env


def manage(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    """``python example_project/manage.py ARGS``; with ``check``, fail showing its output."""
    result = subprocess.run(
        [sys.executable, str(MANAGE), *args],
        cwd=EXAMPLE,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check:
        assert result.returncode == 0, (
            f"manage.py {' '.join(args)} exited {result.returncode}\n"
            f"--- stdout ---\n{result.stdout[-4000:]}\n--- stderr ---\n{result.stderr[-4000:]}"
        )
    return result


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def live_server(env: dict[str, str], *options: str, timeout: float = 60) -> Iterator[str]:
    """``manage.py runserver`` on a free loopback port (no autoreloader); yields its base URL
    and stops it (SIGTERM, then SIGKILL) on the way out. The database must be migrated."""
    port = free_port()
    log = open(Path(env["PMCP_SQLITE_PATH"]).with_suffix(".runserver.log"), "w+")
    server = subprocess.Popen(
        [sys.executable, str(MANAGE), "runserver", f"127.0.0.1:{port}", "--noreload", *options],
        cwd=EXAMPLE,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert server.poll() is None, f"runserver exited {server.returncode}:\n{_read(log)}"
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            assert time.monotonic() < deadline, f"runserver did not listen:\n{_read(log)}"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)
        log.close()


def _read(log: Any) -> str:
    log.flush()
    log.seek(0)
    return log.read()[-6000:]


def run_bash(
    script: str, *, env: dict[str, str], cwd: Path = EXAMPLE, timeout: float = 120
) -> subprocess.CompletedProcess:
    """Run ``script`` with bash (``set -euo pipefail``); fail showing its output."""
    result = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + script],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, (
        f"the shell steps exited {result.returncode}\n--- script ---\n{script}\n"
        f"--- stdout ---\n{result.stdout[-6000:]}\n--- stderr ---\n{result.stderr[-6000:]}"
    )
    return result


# -- links ----------------------------------------------------------------------------------------
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\((?P<target>[^)\s]+)\)")


def links(page: Path) -> list[tuple[int, str]]:
    """``(line, target)`` of every Markdown link outside code blocks and code spans."""
    found: list[tuple[int, str]] = []
    fenced = False
    for number, line in enumerate(page.read_text().splitlines(), start=1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            text = re.sub(r"`[^`]*`", "", line)
            found.extend((number, match["target"]) for match in _LINK.finditer(text))
    return found


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``page`` (and explicit ``id``/``name`` ones)."""
    seen: dict[str, int] = {}
    result: set[str] = set()
    fenced = False
    for line in page.read_text().splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        result.update(re.findall(r"""<a\s+(?:id|name)=["']([^"']+)["']""", line))
        heading = None if fenced else _HEADING.match(line)
        if heading is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading["title"].lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return result


# -- shell blocks ---------------------------------------------------------------------------------
def shell_commands(text: str) -> list[str]:
    """The commands of a shell block, each with its continuation lines, multi-line quotes and
    here-documents; a comment line on its own is a unit too (what the page shows it prints)."""
    units: list[str] = []
    current: list[str] = []
    heredoc: str | None = None
    for line in text.split("\n"):
        if heredoc is not None:
            current.append(line)
            if line.strip() == heredoc:
                units.append("\n".join(current))
                current, heredoc = [], None
            continue
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            if line.strip():
                units.append(line.strip())
            continue
        current.append(line)
        opened = re.search(r"<<-?\s*'?(\w+)'?", line)
        if opened:
            heredoc = opened.group(1)
            continue
        joined = "\n".join(current)
        if joined.endswith("\\"):
            continue
        try:
            shlex.split(joined, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        units.append(joined)
        current = []
    assert not current and heredoc is None, f"an unfinished command: {current}"
    return units


@dataclass
class ShellStep:
    command: str
    shown: list[str]  # the comment lines under it on the page
    stdout: str = ""
    requests: list[tuple[int, str, str]] | None = None  # (status, method, url) of each curl


HTTP_MARK = "@@http"
STEP_MARK = "@@step"
# Every curl reports its status on stderr (and ends its output with a newline).
_CURL_FORMAT = f"\\n%{{stderr}}{HTTP_MARK} %{{http_code}} %{{method}} %{{url_effective}}\\n"
CURL_LOG = f"curl() {{ command curl -w '{_CURL_FORMAT}' \"$@\"; }}\n"


def shell_steps(blocks: list[Block]) -> list[ShellStep]:
    steps: list[ShellStep] = []
    for block in blocks:
        for unit in shell_commands(block.text):
            if unit.startswith("#"):
                if steps:
                    steps[-1].shown.append(unit.lstrip("#").strip())
            else:
                steps.append(ShellStep(command=unit, shown=[]))
    return steps


def run_steps(
    steps: list[ShellStep], *, env: dict[str, str], cwd: Path, preamble: str = ""
) -> list[ShellStep]:
    """Run the steps in one bash session (stopping at the first failing one); fill in what
    each printed and the HTTP requests it made."""
    script = [CURL_LOG, preamble]
    for index, step in enumerate(steps):
        script += [step.command, f"echo '{STEP_MARK} {index}'; echo '{STEP_MARK} {index}' >&2"]
    result = run_bash("\n".join(script), env=env, cwd=cwd)
    outputs = re.split(rf"^{STEP_MARK} \d+\n", result.stdout, flags=re.MULTILINE)
    logs = re.split(rf"^{STEP_MARK} \d+\n", result.stderr, flags=re.MULTILINE)
    for step, out, log in zip(steps, outputs, logs, strict=False):
        step.stdout = out
        step.requests = [
            (int(status), method, url)
            for status, method, url in re.findall(rf"^{HTTP_MARK} (\d+) (\S+) (\S+)$", log, re.M)
        ]
    return steps
