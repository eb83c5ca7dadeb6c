"""What the mock provider is asked to be: its address, the latency and caps it simulates, and the
faults it injects. A module of its own, so the batch routes (`batches.py`) and the server
(`server.py`) both read it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FAULT_KINDS = ("429", "408", "500", "502", "503", "529", "hang", "malformed")


@dataclass
class MockProviderConfig:
    host: str = "127.0.0.1"
    port: int = 0
    latency: float = 0.0
    jitter: float = 0.0
    max_concurrency: int | None = None
    concurrency_retry_after: float = 1.0
    rpm: int | None = None
    rpm_window: float = 60.0  # seconds the `rpm` and `tpm` caps count over (tests shorten it)
    tpm: int | None = None  # tokens admitted per window (a call: its prompt + max_tokens)
    rpm_model: str | None = None  # the `rpm` cap counts and limits this model's calls only
    # Rate-limit headers as an OpenAI-compatible proxy (LiteLLM) sends them: answers say the limit
    # and what is left without a reset; a 429 has no retry-after, only the upstream's wait
    # passed on as `llm_provider-retry-after` (the whole window).
    proxy_headers: bool = False
    fault_rates: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    hang_seconds: float = 60.0
    batch_latency: float = 0.5
    # Batch faults (see `batches.py` for the per-prompt directives).
    batch_finalize_seconds: float = 0.0
    batch_create_stall: float = 0.0
    batch_results_stall: float = 0.0
    batch_expire_rate: float = 0.0
    batch_fail_rate: float = 0.0
    batch_line_error_rate: float = 0.0
    batch_cancel_ended_refused: bool = False  # a cancel of an ended batch answers 400
    backlog: int = 1024


def parse_fault_rates(items: list[str]) -> dict[str, float]:
    rates: dict[str, float] = {}
    for item in items:
        kind, sep, value = item.partition("=")
        if not sep or kind not in FAULT_KINDS:
            raise ValueError(f"--fault-rate {item!r}: expected KIND=RATE with KIND one of {', '.join(FAULT_KINDS)}")
        try:
            rate = float(value)
        except ValueError:
            raise ValueError(f"--fault-rate {item!r}: {value!r} is not a number") from None
        if not 0 <= rate <= 1:
            raise ValueError(f"--fault-rate {item!r}: rate must be between 0 and 1")
        rates[kind] = rate
    return rates
