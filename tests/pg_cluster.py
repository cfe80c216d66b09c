"""Start and stop a throwaway PostgreSQL cluster for the test suite.

Standard library only, so it can be used before the project's virtualenv exists
(``.ci/run`` asks it whether server binaries are present).

Usage::

    from tests.pg_cluster import throwaway_cluster

    with throwaway_cluster() as pg:
        os.environ.update(pg.env())  # PMCP_PG_HOST, PMCP_PG_PORT, PMCP_PG_USER, PMCP_PG_DB
        ...

The cluster lives in a fresh temporary directory, listens only on 127.0.0.1 on a free
port (plus a unix socket inside the temporary directory), and is stopped with
``pg_ctl stop -m immediate`` and deleted on exit.  It never touches any other server.

``python -m tests.pg_cluster`` starts one, prints its env lines and waits for Ctrl-C;
``python -m tests.pg_cluster --bindir`` prints the server binary directory (exit 1 if none).
"""

from __future__ import annotations

import contextlib
import glob
import importlib
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

PG_OS_USER = "pmcp_pg"  # unprivileged OS user that owns the cluster when we run as root
PG_SUPERUSER = "postgres"  # database superuser created by initdb
PG_DBNAME = "postgres"
HOST = "127.0.0.1"

SERVER_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",
    "shared_buffers": "128MB",
    "logging_collector": "off",
}


class PostgresUnavailable(RuntimeError):
    """PostgreSQL server binaries cannot be found (or installed), or the cluster won't start."""


# --------------------------------------------------------------------------- binaries


def _is_server_bindir(path: str | os.PathLike[str] | None) -> bool:
    if not path:
        return False
    p = Path(path)
    return all(os.access(p / name, os.X_OK) for name in ("initdb", "pg_ctl", "postgres"))


def _version_key(bindir: str) -> tuple[int, ...]:
    # /usr/lib/postgresql/<version>/bin
    version = Path(bindir).parent.name
    return tuple(int(n) for n in re.findall(r"\d+", version)) or (0,)


def find_bindir() -> Path | None:
    """Directory holding initdb, pg_ctl and postgres, or None.

    Order: $PMCP_PG_BINDIR, ``pg_config --bindir``, the highest /usr/lib/postgresql/*/bin,
    then initdb/pg_ctl on PATH.
    """
    override = os.environ.get("PMCP_PG_BINDIR")
    if override:
        return Path(override) if _is_server_bindir(override) else None

    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=30, check=True
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        # libpq-dev's pg_config may name a bindir that has no server installed in it.
        if _is_server_bindir(out):
            return Path(out)

    candidates = [d for d in glob.glob("/usr/lib/postgresql/*/bin") if _is_server_bindir(d)]
    if candidates:
        return Path(max(candidates, key=_version_key))

    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        # Follow symlinks (e.g. /usr/local/bin/initdb -> /usr/lib/postgresql/15/bin/initdb)
        # so that pg_ctl finds the matching postgres binary next to it.
        real = Path(initdb).resolve().parent
        if _is_server_bindir(real):
            return real
        here = Path(initdb).parent
        if _is_server_bindir(here):
            return here
    return None


def ensure_postgres_binaries(install: bool = True) -> Path:
    """Return the server bindir, installing Debian's ``postgresql`` package if needed.

    Installation is attempted only when *install* is true, we are root and apt-get
    exists (and $PMCP_NO_APT is not set). Raises PostgresUnavailable otherwise.
    """
    bindir = find_bindir()
    if bindir is not None:
        return bindir
    apt_get = shutil.which("apt-get")
    can_install = (
        install and os.geteuid() == 0 and apt_get is not None and not os.environ.get("PMCP_NO_APT")
    )
    if not can_install:
        raise PostgresUnavailable(
            "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found; install them "
            "(Debian: apt-get install postgresql) or set PMCP_PG_BINDIR"
        )
    print("pg_cluster: PostgreSQL server binaries not found; installing Debian's postgresql")
    sys.stdout.flush()
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        subprocess.run([apt_get, "update"], check=True, env=env, stdin=subprocess.DEVNULL)
        subprocess.run(
            [apt_get, "install", "-y", "postgresql"],
            check=True,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        raise PostgresUnavailable(f"apt-get install postgresql failed: {exc}") from exc
    bindir = find_bindir()
    if bindir is None:
        raise PostgresUnavailable("installed postgresql but still found no server binaries")
    return bindir


# --------------------------------------------------------------------------- OS user


def _ensure_os_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(PG_OS_USER)
    except KeyError:
        pass
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    cmd = [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_OS_USER]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    try:  # re-check: a concurrent run may have created it first
        return pwd.getpwnam(PG_OS_USER)
    except KeyError:
        raise PostgresUnavailable(
            f"cannot create OS user {PG_OS_USER!r} (initdb refuses to run as root): "
            f"{proc.stderr.strip() or proc.returncode}"
        ) from None


def _as_user_prefix(user: pwd.struct_passwd) -> list[str] | None:
    """Command prefix that runs a command as *user*; None means 'wrap with su'."""
    runuser = shutil.which("runuser")
    if runuser is None and os.access("/usr/sbin/runuser", os.X_OK):
        runuser = "/usr/sbin/runuser"  # /usr/sbin may be missing from PATH
    if runuser:
        return [runuser, "-u", user.pw_name, "--"]
    setpriv = shutil.which("setpriv")
    if setpriv:
        return [
            setpriv,
            f"--reuid={user.pw_uid}",
            f"--regid={user.pw_gid}",
            "--init-groups",
            "--",
        ]
    return None


# --------------------------------------------------------------------------- cluster


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class Cluster:
    """A throwaway cluster; use :func:`throwaway_cluster` rather than this directly."""

    def __init__(self, bindir: Path | None = None, timeout: float = 60.0) -> None:
        self.bindir = Path(bindir) if bindir else ensure_postgres_binaries(install=False)
        self.timeout = timeout
        self.host = HOST
        self.port: int | None = None
        self.user = PG_SUPERUSER
        self.dbname = PG_DBNAME
        self.tmpdir: Path | None = None
        self._os_user: pwd.struct_passwd | None = None
        self._prefix: list[str] | None = []
        self._started = False

    # paths ---------------------------------------------------------------
    @property
    def datadir(self) -> Path:
        assert self.tmpdir is not None
        return self.tmpdir / "data"

    @property
    def socket_dir(self) -> Path:
        assert self.tmpdir is not None
        return self.tmpdir / "sock"

    @property
    def logfile(self) -> Path:
        assert self.tmpdir is not None
        return self.tmpdir / "server.log"

    # public --------------------------------------------------------------
    def env(self) -> dict[str, str]:
        return {
            "PMCP_PG_HOST": self.host,
            "PMCP_PG_PORT": str(self.port),
            "PMCP_PG_USER": self.user,
            "PMCP_PG_DB": self.dbname,
        }

    @property
    def dsn(self) -> str:
        return f"host={self.host} port={self.port} user={self.user} dbname={self.dbname}"

    def __repr__(self) -> str:
        return f"<Cluster {self.dsn} dir={self.tmpdir}>"

    # helpers -------------------------------------------------------------
    def _run(self, args: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        """Run a server binary as the cluster's OS user."""
        if self._prefix is None:  # su fallback
            assert self._os_user is not None
            cmd = ["su", "-s", "/bin/sh", self._os_user.pw_name, "-c", shlex.join(args)]
        else:
            cmd = [*self._prefix, *args]
        return subprocess.run(
            cmd,
            cwd=self.tmpdir,  # the OS user may not be able to read the caller's cwd
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            **kw,  # type: ignore[arg-type]
        )

    def _chown(self, path: Path) -> None:
        if self._os_user is not None:
            os.chown(path, self._os_user.pw_uid, self._os_user.pw_gid)

    # lifecycle -----------------------------------------------------------
    def start(self) -> None:
        if os.geteuid() == 0:
            self._os_user = _ensure_os_user()
            self._prefix = _as_user_prefix(self._os_user)
            parent = "/tmp"  # must be traversable by the unprivileged user
        else:
            parent = None
        self.tmpdir = Path(tempfile.mkdtemp(prefix="pmcp-pg-", dir=parent))
        self._chown(self.tmpdir)
        os.chmod(self.tmpdir, 0o700)
        self.socket_dir.mkdir(mode=0o700)
        self._chown(self.socket_dir)

        initdb = [
            str(self.bindir / "initdb"),
            "-D",
            str(self.datadir),
            "-A",
            "trust",
            "-U",
            PG_SUPERUSER,
            "--encoding=UTF8",
            "--no-locale",
            "-N",  # no fsync of the new cluster: it is thrown away anyway
        ]
        proc = self._run(initdb, timeout=self.timeout * 3)
        if proc.returncode != 0:
            raise PostgresUnavailable(
                f"initdb failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            )

        settings = dict(SERVER_SETTINGS, unix_socket_directories=f"'{self.socket_dir}'")
        with open(self.datadir / "postgresql.conf", "a", encoding="utf-8") as fh:
            fh.write("\n# --- pmcp throwaway test cluster ---\n")
            for key, value in settings.items():
                fh.write(f"{key} = {value}\n")

        last_error = ""
        for _attempt in range(5):  # the free port may be taken between pick and bind
            self.port = _free_port()
            proc = self._run(
                [
                    str(self.bindir / "pg_ctl"),
                    "-D",
                    str(self.datadir),
                    "-l",
                    str(self.logfile),
                    "-o",
                    f"-p {self.port}",
                    "-w",
                    "-t",
                    str(int(self.timeout)),
                    "start",
                ],
                timeout=self.timeout + 30,
            )
            self._started = True  # something may be running even if pg_ctl failed
            if proc.returncode == 0:
                self._wait_ready()
                return
            last_error = f"{proc.stdout}\n{proc.stderr}\n--- server log ---\n{_tail(self.logfile)}"
            self._stop_server()
            if "could not bind" not in last_error and "in use" not in last_error:
                break
        raise PostgresUnavailable(f"PostgreSQL did not start:\n{last_error}")

    def _wait_ready(self) -> None:
        """Poll until the server answers: psycopg if importable, else pg_isready, else TCP."""
        try:
            psycopg = importlib.import_module("psycopg")  # optional: this module is stdlib-only
        except ImportError:
            psycopg = None
        retry: tuple[type[BaseException], ...] = (OSError, subprocess.SubprocessError)
        if psycopg is not None:
            retry += (psycopg.Error,)
        pg_isready = self.bindir / "pg_isready"
        deadline = time.monotonic() + self.timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                if psycopg is not None:
                    with psycopg.connect(self.dsn, connect_timeout=5) as conn:
                        conn.execute("select 1")
                    return
                if os.access(pg_isready, os.X_OK):
                    proc = subprocess.run(
                        [str(pg_isready), "-q", "-h", self.host, "-p", str(self.port),
                         "-U", self.user, "-d", self.dbname, "-t", "5"],
                        capture_output=True,
                        timeout=30,
                    )  # fmt: skip
                    if proc.returncode == 0:
                        return
                    last = f"pg_isready exit {proc.returncode}"
                else:
                    assert self.port is not None
                    with socket.create_connection((self.host, self.port), timeout=5):
                        return
            except retry as exc:
                last = repr(exc)
            time.sleep(0.2)
        raise PostgresUnavailable(
            f"PostgreSQL on {self.host}:{self.port} not ready after {self.timeout}s: {last}\n"
            f"--- server log ---\n{_tail(self.logfile)}"
        )

    def _postmaster_pid(self) -> int | None:
        try:
            first = (self.datadir / "postmaster.pid").read_text().splitlines()[0]
            return int(first.strip())
        except (OSError, IndexError, ValueError):
            return None

    def _stop_server(self) -> None:
        if not self._started or self.tmpdir is None or not self.datadir.exists():
            return
        pid = self._postmaster_pid()
        try:
            self._run(
                [str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", "immediate",
                 "-w", "-t", "30", "stop"],
                timeout=60,
            )  # fmt: skip
        except (OSError, subprocess.SubprocessError):
            pass
        if pid is not None and _alive(pid) and self._postmaster_pid() == pid:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)  # our own postmaster, found via our data dir
            deadline = time.monotonic() + 10
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
        self._started = False

    def stop(self) -> None:
        """Stop the server (immediate mode) and delete the temporary directory. Idempotent."""
        with _sigint_deferred():
            try:
                self._stop_server()
            finally:
                if self.tmpdir is not None:
                    shutil.rmtree(self.tmpdir, ignore_errors=True)
                    self.tmpdir = None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited already; it only waits for init to reap it
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Ignore a second Ctrl-C while cleaning up (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def throwaway_cluster(bindir: Path | None = None, timeout: float = 60.0) -> Iterator[Cluster]:
    """Start a fresh cluster; yield it (host, port, user, dbname, env()); always clean up."""
    cluster = Cluster(bindir=bindir, timeout=timeout)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--bindir"]:
        bindir = find_bindir()
        if bindir is None:
            print("no PostgreSQL server binaries found", file=sys.stderr)
            return 1
        print(bindir)
        return 0
    if argv:
        print("usage: python -m tests.pg_cluster [--bindir]", file=sys.stderr)
        return 2

    def _term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
    try:
        with throwaway_cluster(ensure_postgres_binaries()) as pg:
            for key, value in pg.env().items():
                print(f"export {key}={value}")
            print(f"# data dir: {pg.tmpdir}  (Ctrl-C to stop and delete)", flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        print("\nstopped", file=sys.stderr)
    except PostgresUnavailable as exc:
        print(f"pg_cluster: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
