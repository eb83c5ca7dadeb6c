"""What a job cost, and what it would have cost had every answer been an online call.

Batch answers are priced at the discount (`Price.batch_discount`), so each one's online price
is its cost / (1 - discount): exact, from what was recorded, with no usage read again. Batch
answers that came after their request had gone online (delivery `auto` at its deadline) were
paid for but would not exist online: in the cost, not in the all-online figure. Answers from
the response cache cost nothing either way.
"""

from __future__ import annotations

from typing import Any

from ledger.prices import PriceTable


def job_savings(costs: list[dict[str, Any]], prices: PriceTable) -> dict[str, float]:
    """`cost_usd`, `all_online_usd` and `saved_usd` (their difference) from `Store.job_costs`."""
    spent = online = 0.0
    for row in costs:
        spent += row["cost_usd"]
        if row["path"] == "late":
            continue
        price = prices.price(row["provider"], row["model"])
        discount = price.batch_discount if price is not None and row["path"] == "batch" else 0.0
        online += row["cost_usd"] / (1.0 - discount) if discount < 1.0 else 0.0
    return {"cost_usd": round(spent, 10), "all_online_usd": round(online, 10), "saved_usd": round(online - spent, 10)}
