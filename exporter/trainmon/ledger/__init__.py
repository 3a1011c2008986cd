"""The run ledger: every training run's description and measured summary, kept on the node.

``Ledger`` (``store``) is the SQLite file and its read API, ``RunRecord``
(``records``) one run, ``summary`` the math behind a record's numbers, and
``config`` the ``collectors.ledger`` section. ``RunRecorder`` (``recorder``)
fills it from the training store, read through ``feed`` (read-only
protocols), ending runs by the policy of ``ending``; ``api`` serves the
records as JSON. The derived collector ``trainmon.collectors.ledger`` wires
the recorder and exports its metrics.
"""

from trainmon.ledger.records import (
    END_REASONS,
    FINAL_END_REASONS,
    RunRecord,
    combined_end_reason,
)
from trainmon.ledger.schema import APPLICATION_ID, SCHEMA_VERSION, LedgerError
from trainmon.ledger.store import Ledger, Pruned, RecordUpdate, WriteResult

__all__ = ["APPLICATION_ID", "END_REASONS", "FINAL_END_REASONS", "SCHEMA_VERSION", "Ledger",
           "LedgerError", "Pruned", "RecordUpdate", "RunRecord", "WriteResult",
           "combined_end_reason"]
