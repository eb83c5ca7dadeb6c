"""What a `ledger` process imports before its command runs.

Every command starts by importing the command line. The ones that need no database (the
mock provider, `--help`) must not pay for SQLAlchemy, SQLModel, Alembic or psycopg: they
were most of each process's second of start-up (decision 83).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import ledger

DATABASE_STACK = ("sqlalchemy", "sqlmodel", "alembic", "psycopg", "ledger.store", "ledger.api")


def _run(script: str) -> tuple[set[str], str]:
    """The modules a fresh interpreter holds after running `script` (which must not fail), and
    what it wrote to stderr."""
    probe = f"{script}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(json.loads(done.stdout.splitlines()[-1])), done.stderr


def _loaded_after(script: str) -> set[str]:
    return _run(script)[0]


def _database_stack(loaded: set[str]) -> set[str]:
    return {m for m in loaded if m.split(".")[0] in DATABASE_STACK or m in DATABASE_STACK}


def test_the_command_line_imports_no_database_stack() -> None:
    assert not _database_stack(_loaded_after("import ledger.cli"))


def test_a_command_that_fails_on_a_bad_setting_imports_no_database_stack() -> None:
    """The one-line error comes before any database is opened, and without SQLAlchemy's import."""
    run_status = (
        "import os; os.environ['MAX_CONCURRENT_LLM_CALLS'] = 'abc'; from ledger.cli import app\n"
        "try:\n    app(['status'])\nexcept SystemExit as stop:\n    assert stop.code == 2, stop.code"
    )
    loaded, stderr = _run(run_status)
    assert "MAX_CONCURRENT_LLM_CALLS" in stderr
    assert not _database_stack(loaded)


def test_the_package_names_import_their_modules_on_first_use() -> None:
    assert "ledger.api" not in _loaded_after("import ledger")
    assert "ledger.api" in _loaded_after("from ledger import Ledger")


@pytest.mark.parametrize("name", ledger.__all__)
def test_every_public_name_is_reachable_from_the_package(name: str) -> None:
    value = getattr(ledger, name)
    assert value.__name__ == name  # the class or function itself, from the module that defines it
    assert name in dir(ledger)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        ledger.Nope  # noqa: B018
