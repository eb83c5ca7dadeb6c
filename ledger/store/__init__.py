"""The only code that issues SQL: one `Store` per database, shared by every stage."""

from __future__ import annotations

from sqlalchemy.engine import Engine

from ledger.store.audit import AuditQueries
from ledger.store.batch_results import BatchResultQueries
from ledger.store.batches import OPEN_BATCHES, BatchQueries
from ledger.store.browse import BrowseQueries
from ledger.store.commit import any_row
from ledger.store.deadlines import DeadlineQueries, DeliveryReadings
from ledger.store.dialect import Dialect
from ledger.store.estimates import EstimateQueries
from ledger.store.intake import IntakeQueries
from ledger.store.jobs import ACTIVE_JOBS, JobQueries
from ledger.store.lineage import LineageQueries
from ledger.store.pool_overrides import PoolOverrideQueries
from ledger.store.pools import NO_RULES, PoolRules
from ledger.store.queue import REQUESTS_LEFT, EnqueueResult, QueueQueries
from ledger.store.schema import DatabaseError, open_engine

__all__ = ["DatabaseError", "EnqueueResult", "Store"]


class Store(
    QueueQueries,
    IntakeQueries,
    BatchQueries,
    BatchResultQueries,
    DeadlineQueries,
    DeliveryReadings,
    EstimateQueries,
    PoolOverrideQueries,
    JobQueries,
    AuditQueries,
    LineageQueries,
    BrowseQueries,
):
    """Issues every query the ledger makes, on an engine whose schema is at head."""

    engine: Engine
    dialect: Dialect

    def __init__(
        self,
        url: str,
        *,
        ping_on_checkout: bool = True,
        idle_in_transaction_s: float | None = None,
        background_checkpoints: bool = False,
        prepared_hot_statements: bool = False,
        pool_rules: PoolRules = NO_RULES,
        pool_probe_seconds: float = 60.0,
    ) -> None:
        """`background_checkpoints` (the daemon's): SQLite's WAL is copied back into the database
        file by a thread of the store's, not inside the commits (`checkpoints.py`).
        `prepared_hot_statements` (the daemon's): PostgreSQL sessions keep the hot statements
        prepared (`prepared.py`), and the driver prepares nothing of its own. `pool_rules`:
        RPM/TPM caps and slow start (LEDGER_POOL_RPM, _TPM, _SLOW_START); `pool_probe_seconds`: how
        long a learned limit stands before one more slot is tried (LEDGER_POOL_PROBE_SECONDS)."""
        self.url = url
        self.job_caps = {}
        self.pool_rules = pool_rules
        self.pool_probe_seconds = pool_probe_seconds
        self.learning = set()
        self.windowed = set()
        self.pool_slots_made = {}
        self.engine, self.dialect = open_engine(
            url,
            ping_on_checkout=ping_on_checkout,
            idle_in_transaction_s=idle_in_transaction_s,
            background_checkpoints=background_checkpoints,
            prepared_hot_statements=prepared_hot_statements,
        )
        self._checkpoints = self.dialect.checkpoints(self.engine) if background_checkpoints else None

    def has_work(self) -> bool:
        """Anything left for a daemon: online requests queued or in flight, provider batch work,
        or an evaluation job still to advance (parsing and gap-filling included).

        One connection; the two small tables are read first: while a batch or a job is open (long stretches, in
        which every idle loop asks this each poll interval) the large one is not read at all. A
        mapping batch leaves tens of thousands of dead index entries behind it, which made the
        requests' probe 10-35 ms, queued in the database lane ahead of the mapping's writes."""
        return any_row(self.engine, OPEN_BATCHES, ACTIVE_JOBS, REQUESTS_LEFT)

    def close(self) -> None:
        if self._checkpoints is not None:
            self._checkpoints.stop()
        self.engine.dispose()
