"""Named points where a daemon can be made to die outright, for crash tests of real processes.

`LEDGER_STOP_AT=<name>` in a daemon's environment kills it with SIGKILL (no cleanup, no
`finally`, like a power cut) the first time it reaches that point: a test can then prove a
restart loses nothing at exactly the moment that matters (a batch's cancel sent, its
requests not yet called online), without racing a timer. Unset, a point costs one lookup.
"""

from __future__ import annotations

import os
import signal

ENV_VAR = "LEDGER_STOP_AT"


def stop_point(name: str) -> None:
    """Die here, at once, if this process was told to (`LEDGER_STOP_AT=name`)."""
    if os.environ.get(ENV_VAR) == name:
        os.kill(os.getpid(), signal.SIGKILL)
