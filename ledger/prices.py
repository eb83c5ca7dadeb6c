"""The price table and the cost of a request.

Prices change every few months and differ per account tier, so they live in an
editable TOML table (`ledger/data/prices.toml`, overridable entry by entry with
`LEDGER_PRICES_FILE`) rather than in code. Cost is derived from the exact usage
the provider reported, so a corrected price can be re-applied later with SQL
without calling anything again.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from adapters.token_limit import output_limit
from ledger.fingerprint import canonical

_DATE_SUFFIX = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8})$")
_PER_TOKEN = 1e-6
# Worst-case output when a request sets no max_tokens (what a budget reserves for it).
DEFAULT_MAX_OUTPUT_TOKENS = 4096
# An upper bound on input tokens: no tokenizer in use gives fewer than ~3 bytes per token
# on ordinary text, so bytes / 3 over-reserves rather than under.
_BYTES_PER_TOKEN_AT_LEAST = 3


class PriceTableError(ValueError):
    """The price file cannot be used; the message is one line naming the file and the entry."""


@dataclass(frozen=True)
class Price:
    """USD per million tokens; `batch_discount` the share a provider batch job saves.

    `cached_input`: cached prompt tokens (OpenAI's discounted `cached_tokens`, Anthropic's cache
    reads); `cache_write`: tokens written to a prompt cache (Anthropic's cache creation, dearer
    than input). Either, when not given, is priced at `input`."""

    input: float
    output: float
    batch_discount: float = 0.0
    cached_input: float | None = None
    cache_write: float | None = None

    def cost(
        self,
        input_tokens: int | None,
        output_tokens: int | None,
        *,
        batch: bool = False,
        cached_input_tokens: int | None = None,
        cache_write_tokens: int | None = None,
    ) -> float:
        """uncached input x `input` + cached x `cached_input` + cache writes x `cache_write` +
        output x `output`, the batch discount applied to the whole. `input_tokens` counts every
        input token, the cached ones and the cache writes among them."""
        cached, written = cached_input_tokens or 0, cache_write_tokens or 0
        uncached = max((input_tokens or 0) - cached - written, 0)
        usd = (
            uncached * self.input
            + cached * (self.input if self.cached_input is None else self.cached_input)
            + written * (self.input if self.cache_write is None else self.cache_write)
            + (output_tokens or 0) * self.output
        ) * _PER_TOKEN
        return round(usd * (1.0 - self.batch_discount) if batch else usd, 10)

    def usage_cost(self, input_tokens: int | None, output_tokens: int | None, *, batch: bool = False) -> float | None:
        """`cost` of what a provider reported; None when it reported no usage at all."""
        if input_tokens is None and output_tokens is None:
            return None
        return self.cost(input_tokens, output_tokens, batch=batch)

    def answer_cost(self, answer: Any, *, batch: bool = False) -> float | None:
        """`cost` of an answer (`adapters.base.CallResult`: its usage in full); None without usage."""
        if answer.input_tokens is None and answer.output_tokens is None:
            return None
        return self.cost(
            answer.input_tokens,
            answer.output_tokens,
            batch=batch,
            cached_input_tokens=answer.cached_input_tokens,
            cache_write_tokens=answer.cache_write_tokens,
        )

    def most(self, input_tokens: int, output_tokens: int, *, batch: bool = False) -> float:
        """The cost at most of this many tokens: input at the dearest input rate (a prompt may be
        written to a cache, which costs more than reading it plain)."""
        dearest = max(self.input, self.cache_write or 0.0)
        usd = (input_tokens * dearest + output_tokens * self.output) * _PER_TOKEN
        return round(usd * (1.0 - self.batch_discount) if batch else usd, 10)


class PriceTable:
    def __init__(self, prices: dict[tuple[str, str], Price]) -> None:
        self._prices = prices

    def price(self, provider: str, model: str) -> Price | None:
        """The model's price, or its undated alias's (`gpt-4o-2024-08-06` -> `gpt-4o`), or None."""
        found = self._prices.get((provider, model))
        if found is None:
            undated = _DATE_SUFFIX.sub("", model)
            found = self._prices.get((provider, undated)) if undated != model else None
        return found

    def cost(
        self, provider: str, model: str, input_tokens: int | None, output_tokens: int | None, *, batch: bool = False
    ) -> float | None:
        """USD for this usage, or None for a model the table does not know (or unknown usage)."""
        price = self.price(provider, model)
        return None if price is None else price.usage_cost(input_tokens, output_tokens, batch=batch)

    def answer_cost(self, provider: str, model: str, answer: Any, *, batch: bool = False) -> float | None:
        """USD for an answer's usage in full (cached input and cache writes at their own rates),
        or None for a model the table does not know (or an answer without usage)."""
        price = self.price(provider, model)
        return None if price is None else price.answer_cost(answer, batch=batch)

    def worst_case(
        self, provider: str, model: str, prompt_bytes: int, params: dict[str, Any] | None, *, batch: bool = False
    ) -> float | None:
        """What a request can cost at most (budgets reserve this), or None without a price."""
        price = self.price(provider, model)
        if price is None:
            return None
        input_tokens, max_out = most_tokens(prompt_bytes, params)
        return price.most(input_tokens, max_out, batch=batch)


def input_bytes(input_: Any, text: str | None = None) -> int:
    """A request's stored input (system, messages) as the estimates size it: its canonical JSON
    (`ledger.fingerprint.canonical`) in UTF-8; `text`: that JSON, when an enqueue made it already."""
    return len((canonical(input_) if text is None else text).encode("utf-8", "surrogatepass"))


def most_tokens(prompt_bytes: int, params: dict[str, Any] | None) -> tuple[int, int]:
    """(input tokens at most, output tokens at most) of a request: what a TPM cap reserves for it,
    and what a provider's token window must still hold for it to be admitted."""
    params = params or {}
    max_out = output_limit(params) or DEFAULT_MAX_OUTPUT_TOKENS
    return -(-prompt_bytes // _BYTES_PER_TOKEN_AT_LEAST), int(max_out)


def token_estimate(prompt_bytes: int, params: dict[str, Any] | None) -> int:
    """The tokens a request may use at most (input + max_tokens): what a TPM cap reserves for it."""
    return sum(most_tokens(prompt_bytes, params))


def _read(text: str, where: str) -> dict[tuple[str, str], Price]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PriceTableError(f"{where}: not valid TOML ({exc})") from None
    prices: dict[tuple[str, str], Price] = {}
    for provider, section in data.items():
        if not isinstance(section, dict):
            raise PriceTableError(f"{where}: [{provider}] must be a table")
        unknown = set(section) - {"batch_discount", "models"}
        if unknown:
            raise PriceTableError(f"{where}: [{provider}] has unknown key {sorted(unknown)[0]!r}")
        default_discount = _number(section.get("batch_discount", 0.0), f"{where}: {provider}.batch_discount", 1.0)
        models = section.get("models", {})
        if not isinstance(models, dict):
            raise PriceTableError(f"{where}: [{provider}.models] must be a table")
        for model, entry in models.items():
            key = f"{where}: {provider}.models.{model!r}"
            prices[(provider, model)] = _price(entry, key, default_discount)
    return prices


def _price(entry: Any, key: str, default_discount: float) -> Price:
    if not isinstance(entry, dict):
        raise PriceTableError(f"{key} must be a table like {{ input = 0.15, output = 0.60 }}")
    unknown = set(entry) - {"input", "output", "batch_discount", "cached_input", "cache_write"}
    if unknown:
        raise PriceTableError(f"{key} has unknown key {sorted(unknown)[0]!r}")
    for needed in ("input", "output"):
        if needed not in entry:
            raise PriceTableError(f"{key} is missing {needed!r} (USD per million tokens)")
    return Price(
        _number(entry["input"], f"{key}.input"),
        _number(entry["output"], f"{key}.output"),
        _number(entry.get("batch_discount", default_discount), f"{key}.batch_discount", 1.0),
        _number(entry["cached_input"], f"{key}.cached_input") if "cached_input" in entry else None,
        _number(entry["cache_write"], f"{key}.cache_write") if "cache_write" in entry else None,
    )


def _number(value: Any, key: str, at_most: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise PriceTableError(f"{key} must be a number >= 0, got {value!r}")
    if at_most is not None and value > at_most:
        raise PriceTableError(f"{key} must be <= {at_most:g}, got {value!r}")
    return float(value)


@lru_cache(maxsize=8)
def load_prices(override: str | None = None) -> PriceTable:
    """The shipped table, with `override` (LEDGER_PRICES_FILE) entries on top."""
    shipped = resources.files("ledger").joinpath("data/prices.toml").read_text(encoding="utf-8")
    prices = _read(shipped, "ledger/data/prices.toml")
    if override:
        path = Path(override)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PriceTableError(f"LEDGER_PRICES_FILE: cannot read {path}: {exc}") from None
        prices.update(_read(text, str(path)))
    return PriceTable(prices)
