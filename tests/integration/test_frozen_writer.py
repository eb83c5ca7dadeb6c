"""A daemon frozen inside a transaction must not stall the others (issue 12, defect 3).

PostgreSQL only: SQLite has one write lock per file, and a frozen writer holds it
(docs/decisions.md says what that means for several daemons on one file).
"""

from __future__ import annotations

import threading
import time

from sqlalchemy.exc import DBAPIError

from ledger.enqueue import build_spec, to_row
from ledger.store import Store

LIMITS = {"lease_seconds": 30.0, "global_limit": 5, "pool_limit": lambda _: 5, "max_attempts": 3, "max_claims": 5}
FREEZE_S = 4.0


def test_a_daemon_frozen_holding_the_claim_lock_is_cut_off_and_the_others_claim(pg_url: str) -> None:
    frozen = Store(pg_url, idle_in_transaction_s=0.5)  # as the daemon opens it (a quarter lease)
    other = Store(pg_url, idle_in_transaction_s=0.5)
    other.enqueue([to_row(build_spec(model="m", provider="mock", messages=[{"role": "user", "content": "hi"}]))])
    holding, woke = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def freeze_inside_the_claim() -> None:
        try:
            with frozen.engine.begin() as conn:
                frozen.dialect.serialize_claimers(conn)
                holding.set()
                time.sleep(FREEZE_S)  # the freeze itself (SIGSTOP, a VM pause): no statement runs
                woke.set()
        except DBAPIError as exc:  # the server ended the idle transaction: what this test wants
            errors.append(exc)
        finally:
            woke.set()

    thread = threading.Thread(target=freeze_inside_the_claim)
    thread.start()
    assert holding.wait(10)
    claimed = other.claim("other", **LIMITS)
    still_frozen = not woke.is_set()
    thread.join()
    assert len(claimed.requests) == 1 and still_frozen  # claimed while the frozen daemon still slept
    assert errors, "the frozen session should have been ended by the server"
