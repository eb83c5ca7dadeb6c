"""What a run will cost before it starts (`ledger enqueue FILE --estimate`, `ledger eval SPEC
--estimate`), with the formula budgets reserve by (`PriceTable.worst_case`): the input at
most (its bytes / the fewest bytes a token takes) plus `max_tokens`, at the dearest input rate.

Requests the ledger can already answer from its response cache cost nothing and are counted
apart (`cache_hits`); the tokens and the worst case are those of the requests that would be
called. Each request is counted as it is given (an identical one twice in a file counts twice:
the estimate is an upper bound). Nothing is written: the only read is the cache keys'.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ledger.enqueue import RequestSpec, checked_row
from ledger.prices import input_bytes, most_tokens
from ledger.settings import Settings


@dataclass
class ModelEstimate:
    """One provider and model's share of an estimate."""

    provider: str
    model: str
    requests: int = 0
    input_tokens: int = 0
    max_output_tokens: int = 0
    cache_hits: int = 0
    online_usd: float | None = 0.0  # None: the model has no price
    batch_usd: float | None = 0.0
    _keys: list[tuple[str | None, int, int, float | None, float | None]] = field(default_factory=list, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "model": self.model,
            "requests": self.requests,
            "input_tokens": self.input_tokens,
            "max_output_tokens": self.max_output_tokens,
            "cache_hits": self.cache_hits,
            "worst_case_usd": {"online": _usd(self.online_usd), "batch": _usd(self.batch_usd)},
        }


def estimate(specs: Iterable[RequestSpec], settings: Settings, store: Any | None) -> dict[str, Any]:
    """The estimate as one JSON object: totals and `by_model`. `store` None: a ledger that does
    not exist yet (no cache hits)."""
    models: dict[tuple[str, str], ModelEstimate] = {}
    prices = settings.prices
    for spec in specs:
        row, _ = checked_row(spec, settings.compatible_base_url, None, settings.max_line_bytes)
        prompt_bytes = input_bytes(row["input"])
        tokens_in, tokens_out = most_tokens(prompt_bytes, spec.params)
        online = prices.worst_case(spec.provider, spec.model, prompt_bytes, spec.params)
        batch = prices.worst_case(spec.provider, spec.model, prompt_bytes, spec.params, batch=True)
        key = row["cache_key"] if row["use_cache"] else None
        entry = models.setdefault((spec.provider, spec.model), ModelEstimate(spec.provider, spec.model))
        entry.requests += 1
        entry._keys.append((key, tokens_in, tokens_out, online, batch))
    policy = settings.cache_policy
    known: set[str] = set()
    if store is not None and policy is not None:
        keys = [k for m in models.values() for k, *_ in m._keys if k is not None]
        known = store.answered_keys(keys, policy.max_age_days)
    for entry in models.values():
        for key, tokens_in, tokens_out, online, batch in entry._keys:
            if key is not None and key in known:
                entry.cache_hits += 1
                continue
            entry.input_tokens += tokens_in
            entry.max_output_tokens += tokens_out
            entry.online_usd = None if entry.online_usd is None or online is None else entry.online_usd + online
            entry.batch_usd = None if entry.batch_usd is None or batch is None else entry.batch_usd + batch
    by_model = [m.to_json() for m in sorted(models.values(), key=lambda m: (m.provider, m.model))]
    return {
        "requests": sum(m["requests"] for m in by_model),
        "input_tokens": sum(m["input_tokens"] for m in by_model),
        "max_output_tokens": sum(m["max_output_tokens"] for m in by_model),
        "cache_hits": sum(m["cache_hits"] for m in by_model),
        "worst_case_usd": {
            "online": _total(m["worst_case_usd"]["online"] for m in by_model),
            "batch": _total(m["worst_case_usd"]["batch"] for m in by_model),
        },
        "unpriced_models": [f"{m['provider']}:{m['model']}" for m in by_model if m["worst_case_usd"]["online"] is None],
        "by_model": by_model,
    }


def _usd(value: float | None) -> float | None:
    return None if value is None else round(value, 10)


def _total(values: Iterable[float | None]) -> float:
    """The sum over the priced models (unpriced ones are named apart: `unpriced_models`)."""
    return round(sum(v for v in values if v is not None), 10)
