"""Settings read from the environment and `.env`, validated once at start-up.

Every knob an operator may turn lives here so that a bad value is caught before
the daemon touches the database or a provider, with one line that names the
variable, instead of a traceback an hour into a run.
"""

from __future__ import annotations

import os
from functools import cached_property
from typing import TYPE_CHECKING, Any

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

if TYPE_CHECKING:
    from ledger.prices import PriceTable
    from ledger.store.cache import CachePolicy
    from ledger.store.pools import PoolRules

DEFAULT_DATABASE_URL = "sqlite:///ledger.db"
# LEDGER_MAX_LINE_BYTES by default: 8 MiB.
DEFAULT_MAX_LINE_BYTES = 8 * 2**20


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system says), at most four."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(4, cores))


class SettingsError(ValueError):
    """A setting has a value the ledger cannot run with; the message is one line."""


def parse_pool_limits(raw: str, variable: str = "LEDGER_POOL_LIMITS") -> dict[str, int]:
    """Parse `openai:gpt-4o-mini=4,anthropic:claude-sonnet=8` into {pool key: limit}.

    Keys are normalised with the same rules as request endpoints, so an operator
    can write the limit for `http://host:8080/v1` the way they wrote the URL.
    The same form serves LEDGER_POOL_RPM and LEDGER_POOL_TPM (`variable` names it in errors).
    """
    from ledger.pools import normalize_endpoint

    limits: dict[str, int] = {}
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            continue
        key, sep, value = item.rpartition("=")
        if not sep or not key.strip():
            raise ValueError(f"{variable} item {item!r} is not ENDPOINT=LIMIT")
        try:
            limit = int(value)
        except ValueError:
            raise ValueError(f"{variable} item {item!r}: limit {value!r} is not an integer") from None
        if limit < 1:
            raise ValueError(f"{variable} item {item!r}: limit must be >= 1, got {limit}")
        limits[normalize_endpoint(key.strip())] = limit
    return limits


class Settings(BaseSettings):
    """The ledger's configuration; see `.env.example` for one line per variable."""

    model_config = SettingsConfigDict(
        env_file=".env",
        env_file_encoding="utf-8-sig",  # a byte-order mark at the start is not part of the first name
        extra="ignore",
        case_sensitive=False,
        populate_by_name=True,
        env_ignore_empty=True,
    )

    # The bounded-concurrency contract.
    max_concurrent_llm_calls: int = Field(default=5, alias="MAX_CONCURRENT_LLM_CALLS")
    retry_initial_delay: float = Field(default=1.0, alias="RETRY_INITIAL_DELAY", ge=0)
    retry_max_delay: float = Field(default=60.0, alias="RETRY_MAX_DELAY", ge=0)
    retry_max_attempts: int = Field(default=3, alias="RETRY_MAX_ATTEMPTS", ge=1, le=100)
    batching_enabled: bool = Field(default=False, alias="BATCHING_ENABLED")
    llm_call_timeout: float = Field(default=120.0, alias="LLM_CALL_TIMEOUT", gt=0)

    # The ledger's own.
    database_url: str = Field(default=DEFAULT_DATABASE_URL, alias="LEDGER_DATABASE_URL")
    pool_limits_raw: str = Field(default="", alias="LEDGER_POOL_LIMITS")
    default_pool_limit: int | None = Field(default=None, alias="LEDGER_DEFAULT_POOL_LIMIT", ge=1)
    pool_probe_seconds: float = Field(default=60.0, alias="LEDGER_POOL_PROBE_SECONDS", ge=0)
    # Requests / tokens per minute per pool, across every daemon (same form as LEDGER_POOL_LIMITS).
    pool_rpm_raw: str = Field(default="", alias="LEDGER_POOL_RPM")
    pool_tpm_raw: str = Field(default="", alias="LEDGER_POOL_TPM")
    # A pool never seen before opens one call per claim until it has shown it serves its limit.
    pool_slow_start: bool = Field(default=True, alias="LEDGER_POOL_SLOW_START")
    # For tests only: the length of the RPM/TPM "minute", so a test need not wait minutes.
    rate_window_seconds: float = Field(default=60.0, alias="LEDGER_RATE_WINDOW_SECONDS", gt=0)
    lease_seconds: float = Field(default=30.0, alias="LEDGER_LEASE_SECONDS", gt=0)
    poll_interval: float = Field(default=0.5, alias="LEDGER_POLL_INTERVAL", gt=0)
    shutdown_grace: float = Field(default=10.0, alias="LEDGER_SHUTDOWN_GRACE", ge=0)
    db_retry_seconds: float = Field(default=60.0, alias="LEDGER_DB_RETRY_SECONDS", ge=0)
    provider_batch_size: int = Field(default=1000, alias="LEDGER_PROVIDER_BATCH_SIZE", ge=1, le=100_000)
    provider_batch_wait: float = Field(default=60.0, alias="LEDGER_PROVIDER_BATCH_WAIT", ge=0)
    # Lowers the provider's own input-size limit (OpenAI 200 MB, Anthropic 256 MB), e.g. for an
    # account with a smaller one; never raises it.
    provider_batch_max_bytes: int | None = Field(default=None, alias="LEDGER_PROVIDER_BATCH_MAX_BYTES", ge=1024)
    batch_poll_interval: float = Field(default=30.0, alias="LEDGER_BATCH_POLL_INTERVAL", gt=0)
    # Delivery `auto`: this long before a request's deadline, what its provider batch has not
    # answered is taken out of the batch (the batch canceled) and called online.
    deadline_margin_seconds: float = Field(default=1800.0, alias="LEDGER_DEADLINE_MARGIN_SECONDS", ge=1)
    prices_file: str | None = Field(default=None, alias="LEDGER_PRICES_FILE")
    # One JSONL line (or one request from Python, as stored) at most this big: a file with
    # no newline, or a runaway prompt, is refused with one line instead of filling memory.
    max_line_bytes: int = Field(default=DEFAULT_MAX_LINE_BYTES, alias="LEDGER_MAX_LINE_BYTES", ge=1024, le=2**30)
    # Processes that check a large file's lines at `ledger enqueue` (forked, each checking a block of
    # lines at a time): None, the cores this process may use, at most four; 1, checked in-process.
    enqueue_workers_setting: int | None = Field(default=None, alias="LEDGER_ENQUEUE_WORKERS", ge=1, le=64)
    job_capacity: int = Field(default=4, alias="LEDGER_JOB_CAPACITY", ge=1)
    daily_budget_usd: float | None = Field(default=None, alias="LEDGER_DAILY_BUDGET_USD", ge=0)
    log_level: str = Field(default="INFO", alias="LEDGER_LOG_LEVEL")
    # `full`: every answer's body is kept as received (`response`); `derived`: only the fields
    # derived from it (text, finish reason, tool calls, refusal, thinking, usage), for very large runs.
    keep_response: str = Field(default="full", alias="LEDGER_KEEP_RESPONSE")
    # The response cache: `on`, a request identical to one the ledger answered (or is calling)
    # is answered from it (or waits for it) instead of being paid for again; `off`, never.
    cache: str = Field(default="on", alias="LEDGER_CACHE")
    # A pool paused because its account's balance is spent waits this long before one request
    # probes again (a failed probe pauses it as long again); `ledger pools resume` lifts it at once.
    quota_recheck_seconds: float = Field(default=900.0, alias="LEDGER_QUOTA_RECHECK_SECONDS", ge=1)
    # A 429 is waited out (the pool cools down or learns its limit, the attempt counts for no retry
    # limit) until 429s alone have refused a request this long; then it ends `error`. 0: a 429 is
    # an attempt like any other failure.
    rate_limit_give_up_seconds: float = Field(default=900.0, alias="LEDGER_RATE_LIMIT_GIVE_UP_SECONDS", ge=0)
    # The oldest answer the cache copies, in days (unset: any age).
    cache_max_age_days: float | None = Field(default=None, alias="LEDGER_CACHE_MAX_AGE_DAYS", gt=0)
    # Prometheus metrics of the daemon (`ledger daemon --metrics-port`): off unless a port is given;
    # 0 takes a free port, named in the `start` event.
    metrics_port: int | None = Field(default=None, alias="LEDGER_METRICS_PORT", ge=0, le=65535)
    metrics_host: str = Field(default="127.0.0.1", alias="LEDGER_METRICS_HOST")
    metrics_interval: float = Field(default=5.0, alias="LEDGER_METRICS_INTERVAL", gt=0)
    # `ledger web`: the token every request must carry (required to bind other than loopback).
    web_token: str | None = Field(default=None, alias="LEDGER_WEB_TOKEN", repr=False)

    # Provider SDK conventions; read here only to hand them to the adapters.
    openai_api_key: str | None = Field(default=None, alias="OPENAI_API_KEY", repr=False)
    openai_base_url: str | None = Field(default=None, alias="OPENAI_BASE_URL")
    anthropic_api_key: str | None = Field(default=None, alias="ANTHROPIC_API_KEY", repr=False)
    anthropic_base_url: str | None = Field(default=None, alias="ANTHROPIC_BASE_URL")
    compatible_base_url: str | None = Field(default=None, alias="OPENAI_COMPATIBLE_BASE_URL")
    compatible_api_key: str | None = Field(default=None, alias="OPENAI_COMPATIBLE_API_KEY", repr=False)
    # An OpenAI-compatible server's pools: `url`, one for the server (a box that serves every model
    # from the same capacity); `model`, one per model there (a proxy that limits each on its own).
    compatible_pools: str = Field(default="url", alias="LEDGER_COMPATIBLE_POOLS")
    azure_endpoint: str | None = Field(default=None, alias="AZURE_OPENAI_ENDPOINT")
    azure_api_key: str | None = Field(default=None, alias="AZURE_OPENAI_API_KEY", repr=False)
    azure_api_version: str | None = Field(default=None, alias="OPENAI_API_VERSION")
    # Gemini: GOOGLE_API_KEY wins over GEMINI_API_KEY when both are set, as in the SDK.
    google_api_key: str | None = Field(default=None, alias="GOOGLE_API_KEY", repr=False)
    gemini_api_key: str | None = Field(default=None, alias="GEMINI_API_KEY", repr=False)
    gemini_base_url: str | None = Field(default=None, alias="GOOGLE_GEMINI_BASE_URL")

    @field_validator("max_concurrent_llm_calls")
    @classmethod
    def _check_global_limit(cls, value: int) -> int:
        if value <= 0:
            raise ValueError(f"MAX_CONCURRENT_LLM_CALLS must be >= 1, got {value}")
        if value > 50:
            raise ValueError(f"MAX_CONCURRENT_LLM_CALLS must be <= 50, got {value}")
        return value

    @field_validator("pool_limits_raw", "pool_rpm_raw", "pool_tpm_raw")
    @classmethod
    def _check_pool_values(cls, value: str, info: ValidationInfo) -> str:
        parse_pool_limits(value, _env_name(str(info.field_name)))
        return value

    @field_validator("prices_file")
    @classmethod
    def _check_prices_file(cls, value: str | None) -> str | None:
        from ledger.prices import load_prices

        load_prices(value)  # a bad file stops start-up with one line naming the entry
        return value

    @field_validator("compatible_pools")
    @classmethod
    def _check_compatible_pools(cls, value: str) -> str:
        lower = value.strip().lower()
        if lower not in {"url", "model"}:
            raise ValueError(f"LEDGER_COMPATIBLE_POOLS must be url or model, got {value!r}")
        return lower

    @field_validator("keep_response")
    @classmethod
    def _check_keep_response(cls, value: str) -> str:
        lower = value.strip().lower()
        if lower not in {"full", "derived"}:
            raise ValueError(f"LEDGER_KEEP_RESPONSE must be full or derived, got {value!r}")
        return lower

    @property
    def keeps_response(self) -> bool:
        return self.keep_response == "full"

    @field_validator("cache")
    @classmethod
    def _check_cache(cls, value: str) -> str:
        lower = value.strip().lower()
        if lower not in {"on", "off"}:
            raise ValueError(f"LEDGER_CACHE must be on or off, got {value!r}")
        return lower

    @property
    def cache_policy(self) -> CachePolicy | None:
        """How enqueues use the response cache (None: LEDGER_CACHE=off)."""
        from ledger.store.cache import CachePolicy

        return CachePolicy(self.cache_max_age_days) if self.cache == "on" else None

    @field_validator("log_level")
    @classmethod
    def _check_log_level(cls, value: str) -> str:
        upper = value.upper()
        if upper not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
            raise ValueError(f"LEDGER_LOG_LEVEL must be DEBUG, INFO, WARNING or ERROR, got {value!r}")
        return upper

    @property
    def prices(self) -> PriceTable:
        from ledger.prices import load_prices

        return load_prices(self.prices_file)

    @cached_property
    def pool_limits(self) -> dict[str, int]:
        return parse_pool_limits(self.pool_limits_raw)

    @cached_property
    def pool_rules(self) -> PoolRules:
        """What the claim enforces per pool beyond its slots: RPM/TPM caps and slow start."""
        from ledger.store.pools import PoolRules

        return PoolRules(
            rpm=parse_pool_limits(self.pool_rpm_raw, "LEDGER_POOL_RPM"),
            tpm=parse_pool_limits(self.pool_tpm_raw, "LEDGER_POOL_TPM"),
            window_s=self.rate_window_seconds,
            slow_start=self.pool_slow_start,
        )

    @property
    def enqueue_workers(self) -> int:
        """How many processes check a large file's lines (`LEDGER_ENQUEUE_WORKERS`, else the cores)."""
        return self.enqueue_workers_setting or available_cores()

    @property
    def compatible_pools_per_model(self) -> bool:
        """An OpenAI-compatible server's requests pool per model (LEDGER_COMPATIBLE_POOLS=model)."""
        return self.compatible_pools == "model"

    def pool_limit(self, endpoint: str) -> int:
        """A pool's own limit; never above the global one, which caps the sum anyway."""
        limit = self.pool_limits.get(endpoint, self.default_pool_limit or self.max_concurrent_llm_calls)
        return min(limit, self.max_concurrent_llm_calls)


def load_settings(**overrides: Any) -> Settings:
    """Build settings, turning pydantic's multi-line report into one line per bad variable.

    Raises the plain `ValueError` the settings promise for a zero or negative global limit
    (callers and tests match its exact text), `SettingsError` otherwise.
    """
    try:
        return Settings(**overrides)
    except UnicodeDecodeError as exc:  # the .env file
        raise SettingsError(f"{_env_file(overrides)}:{not_utf8(exc)}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "settings"
        message = str(first.get("ctx", {}).get("error") or first["msg"])
        if message.startswith("MAX_CONCURRENT_LLM_CALLS must be >= 1"):
            raise ValueError(message) from None
        name = _env_name(field)
        if not message.startswith(name):
            message = f"{name}: {message} (got {first.get('input')!r})"
        raise SettingsError(message) from None


def _env_file(overrides: dict[str, Any]) -> str:
    found = overrides.get("_env_file", Settings.model_config.get("env_file"))
    return str(found[0] if isinstance(found, list | tuple) else found)


def not_utf8(exc: UnicodeDecodeError) -> str:
    """`LINE: not UTF-8 (byte 0xff at column 5)` for the first bad byte of a decoded text."""
    data = bytes(exc.object)
    line_start = data.rfind(b"\n", 0, exc.start) + 1
    line = data.count(b"\n", 0, exc.start) + 1
    return f"{line}: not UTF-8 (byte 0x{data[exc.start]:02x} at column {exc.start - line_start + 1})"


def _env_name(field: str) -> str:
    info = Settings.model_fields.get(field)
    if info is not None and info.alias:
        return info.alias
    return field.upper()
