"""Engine creation and schema upgrades.

Every command that needs the schema calls `open_engine`, which upgrades to the
Alembic head on first use: a new user never sees "no such table", and two
processes starting together on PostgreSQL do not race (an advisory lock makes
the second wait, then find nothing to do).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, OperationalError

from ledger.errors import DatabaseError as DatabaseError
from ledger.store.dialect import Dialect, read_json
from ledger.store.engine_setup import configure_engine
from ledger.store.errors import DatabaseUnavailable

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATE_LOCK_KEY = 7_391_046_222


def error_reason(error: BaseException) -> str:
    """What the driver said, on one line (no SQL, no parameters: those may hold prompts). libpq
    puts each sentence on a line of its own without a full stop ("Connection refused" / "Is the
    server running ..."): joined, each line that ends without a stop gets one."""
    lines = [" ".join(line.split()) for line in str(getattr(error, "orig", None) or error).splitlines()]
    said = [line for line in lines if line]
    stopped = [f"{line}." if line[-1] not in ".:;?!," else line for line in said[:-1]]
    return " ".join(stopped + said[-1:])


def one_line(error: BaseException | None) -> str:
    """A database error as one short line, with the driver's error class."""
    if error is None:
        return ""
    if isinstance(error, DatabaseUnavailable) and error.__cause__ is not None:
        error = error.__cause__  # the driver's error, as the store's own: shown as the driver's
    orig = getattr(error, "orig", None) or error
    return f"{type(orig).__name__}: {error_reason(error)[:300]}"


def normalize_url(url: str) -> str:
    """Accept the URLs people paste (`postgresql://`, `postgres://`) and use psycopg 3."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise DatabaseError(f"LEDGER_DATABASE_URL: {url!r} is not a database URL") from None
    if parsed.get_backend_name() not in ("sqlite", "postgresql", "postgres"):
        raise DatabaseError(
            f"LEDGER_DATABASE_URL: unsupported database {parsed.get_backend_name()!r} (use sqlite or postgresql)"
        )
    if parsed.get_backend_name() == "sqlite" and _in_memory(parsed.database, parsed.query):
        raise DatabaseError(
            f"LEDGER_DATABASE_URL: {url!r} is an in-memory SQLite database, which forgets every request "
            "when the command ends: name a file (sqlite:///ledger.db) or a PostgreSQL database"
        )
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def _in_memory(database: str | None, query: Mapping[str, object]) -> bool:
    """SQLite's in-memory forms: no file (`sqlite://`, `sqlite:///`), `:memory:`, and the URI
    forms `file::memory:` and `file:NAME?mode=memory`."""
    if not database or database == ":memory:" or database.startswith("file::memory:"):
        return True
    mode = query.get("mode")
    return database.startswith("file:") and (mode == "memory" or (isinstance(mode, tuple) and "memory" in mode))


def shown_url(url: str) -> str:
    """The URL as an operator wrote it, its password hidden: for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def ledger_exists(url: str) -> bool:
    """Whether the database at `url` holds a ledger (its requests table), found without creating
    anything: a SQLite file that is not there is not made (nor its folders), and tables missing
    from a PostgreSQL schema are not made either. Raises `DatabaseError` when the database cannot
    be reached."""
    normalized = normalize_url(url)
    parsed = make_url(normalized)
    if parsed.get_backend_name() == "sqlite":
        database = str(parsed.database)
        if not database.startswith("file:") and not Path(database).expanduser().is_file():
            return False
        # Read only: SQLite would otherwise make an empty file of a name that is not one yet.
        location = database if database.startswith("file:") else Path(database).expanduser().resolve().as_uri()
        read_only = f"{location}{'&' if '?' in location else '?'}mode=ro"
        engine = create_engine("sqlite://", creator=lambda: sqlite3.connect(read_only, uri=True))
    else:
        engine, _ = make_engine(url)
    try:
        with engine.connect() as conn:
            return bool(inspect(conn).has_table("llm_requests"))
    except OperationalError as exc:
        raise DatabaseError(f"cannot open database {shown_url(url)}: {error_reason(exc)}") from None
    finally:
        engine.dispose()


def alembic_config(url: str | None = None) -> Config:
    """Alembic configuration pointing at the migrations shipped inside the package.

    Alembic is imported here and in `upgrade`'s slow path only: a process
    that finds the schema at head (every process but the first on a database) never needs it,
    and its import was a tenth of each `ledger` command's start-up (decision 83)."""
    from alembic.config import Config

    script_location = str(resources.files("migrations"))
    cfg = Config()
    cfg.set_main_option("script_location", script_location)
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", normalize_url(url).replace("%", "%%"))
    return cfg


@lru_cache(maxsize=1)
def newest_migration() -> str:
    """The newest migration's revision, from the scripts' file names (`NNNN_what.py`, revision
    "NNNN"), without importing Alembic: `upgrade` compares the database's revision with it
    first. A test holds every script to that naming and this to Alembic's own head: a stale
    answer here would leave a database one migration behind never upgraded."""
    names = (entry.name for entry in resources.files("migrations").joinpath("versions").iterdir())
    return max(name[:4] for name in names if name[:4].isdigit() and name.endswith(".py"))


# A connection to a host that vanished (no FIN, no RST) fails within ~30 s, whether idle
# (keepalives), sending (tcp_user_timeout) or connecting (connect_timeout), instead of
# leaving a thread waiting on it for the kernel's minutes to hours. A value given in the
# URL's query string wins.
LIBPQ_DEAD_HOST_LIMITS = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 15,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}


def make_engine(
    url: str,
    *,
    ping_on_checkout: bool = True,
    idle_in_transaction_s: float | None = None,
    background_checkpoints: bool = False,
    prepared_hot_statements: bool = False,
) -> tuple[Engine, Dialect]:
    """`ping_on_checkout` tests a pooled PostgreSQL connection before each use, so a long-lived
    process (a stage holding a `Ledger`) survives a server restart unnoticed. The daemon turns
    it off: it retries transactions on a dropped connection anyway (`record.DbLane`), and the
    ping is one more round trip on every claim and outcome."""
    normalized = normalize_url(url)
    kwargs: dict[str, object] = {}
    if normalized.startswith("sqlite"):
        database = make_url(normalized).database
        if database and database != ":memory:":
            _make_parent(Path(database).expanduser())
    else:
        kwargs.update(pool_size=10, max_overflow=10, pool_pre_ping=ping_on_checkout)
        parsed = make_url(normalized)
        if parsed.get_driver_name() == "psycopg":
            kwargs["connect_args"] = {k: v for k, v in LIBPQ_DEAD_HOST_LIMITS.items() if k not in parsed.query}
    engine = create_engine(normalized, json_deserializer=read_json, **kwargs)
    return engine, configure_engine(engine, idle_in_transaction_s, background_checkpoints, prepared_hot_statements)


def _make_parent(database: Path) -> None:
    """The SQLite file's directory, created if missing; a path that cannot hold it (a parent that is
    a file, no permission) is an operator's error: one line, not a traceback."""
    try:
        database.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocking = next((p for p in reversed(database.parents) if p.exists() and not p.is_dir()), database.parent)
        raise DatabaseError(
            f"LEDGER_DATABASE_URL: cannot create the SQLite database {database}: {blocking} is a file, not a directory"
        ) from None
    except OSError as exc:
        raise DatabaseError(
            f"LEDGER_DATABASE_URL: cannot create the SQLite database {database}: {exc.strerror or exc}"
        ) from None


def _current_revision(conn: Connection) -> str | None:
    """The database's revision, as Alembic records it (None: a new database)."""
    if not inspect(conn).has_table("alembic_version"):
        return None
    versions = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    # More than one row: not a revision this code knows; the slow path hands it to Alembic, which refuses it.
    return versions[0] if len(versions) == 1 else None


def upgrade(engine: Engine) -> bool:
    """Upgrade to head; returns True when something was applied."""
    try:
        with engine.connect() as conn:
            if _current_revision(conn) == newest_migration():
                return False
    except OperationalError as exc:
        where = engine.url.render_as_string(hide_password=True)
        raise DatabaseError(f"cannot open database {where}: {error_reason(exc)}") from None
    from alembic import command

    cfg = alembic_config()
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATE_LOCK_KEY})
            conn.commit()
        try:
            if _current_revision(conn) == newest_migration():
                return False
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
            conn.commit()
            return True
        finally:
            if engine.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATE_LOCK_KEY})
                conn.commit()


def open_engine(
    url: str,
    *,
    ping_on_checkout: bool = True,
    idle_in_transaction_s: float | None = None,
    background_checkpoints: bool = False,
    prepared_hot_statements: bool = False,
) -> tuple[Engine, Dialect]:
    """An engine on an up-to-date schema."""
    engine, dialect = make_engine(
        url,
        ping_on_checkout=ping_on_checkout,
        idle_in_transaction_s=idle_in_transaction_s,
        background_checkpoints=background_checkpoints,
        prepared_hot_statements=prepared_hot_statements,
    )
    upgrade(engine)
    return engine, dialect
