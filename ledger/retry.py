"""When to try again, and how long to wait.

`delay = min(initial * 2^(attempt-1) + jitter[0, 0.5], max)`, built from
tenacity's wait strategies so the formula is the well-known one; a provider's
`retry-after` wins when it asks for longer (still capped at the maximum). The
loop itself is not tenacity's: each attempt must be a durable row and the slot
is held in the ledger, so the executor drives the attempts and asks this policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tenacity import RetryCallState, wait_exponential, wait_random
from tenacity.wait import wait_base

from adapters.errors import ProviderError

JITTER_MAX_S = 0.5


@dataclass(frozen=True)
class RetryPolicy:
    initial_delay: float = 1.0
    max_delay: float = 60.0
    max_attempts: int = 3
    _wait: wait_base = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        wait = wait_exponential(multiplier=self.initial_delay, max=self.max_delay) + wait_random(0, JITTER_MAX_S)
        object.__setattr__(self, "_wait", wait)

    def should_retry(self, error: ProviderError, attempt: int) -> bool:
        """Retry transient failures while attempts remain; never a 400/401/403/404 or spent quota."""
        return error.retryable and attempt < self.max_attempts

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
        state.attempt_number = attempt
        delay = min(self._wait(state), self.max_delay)
        if retry_after is not None and retry_after > delay:
            delay = min(retry_after, self.max_delay)
        return delay
