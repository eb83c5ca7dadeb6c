"""`/requests` (filters, keyset pages, export of the filtered set as JSONL or CSV) and
`/requests/{id}` (everything the ledger holds on one request, its attempts as a timeline)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from adapters.base import FINISH_REASONS
from ledger.statuses import Delivery, RequestStatus
from ledger.store.browse import ROW_COLUMNS, RequestFilter
from ledger.web.app import Web, int_param, redact

TEXT_FILTERS = ("status", "job", "pool", "provider", "model", "delivery", "finish_reason", "q")
FLAG_FILTERS = ("parse_error", "had_429")
# The columns of the CSV export: a request list's, and when it ended (the JSONL export has every
# column but the input and the body).
CSV_COLUMNS = (*ROW_COLUMNS, "completed_at")


def filter_of(request: Request) -> RequestFilter:
    q = request.query_params

    def text(name: str) -> str | None:
        return q.get(name) or None

    def flag(name: str) -> bool:
        return q.get(name) in ("1", "on", "true", "yes")

    return RequestFilter(
        status=text("status"),
        job=text("job"),
        pool=text("pool"),
        provider=text("provider"),
        model=text("model"),
        delivery=text("delivery"),
        finish_reason=text("finish_reason"),
        q=text("q"),
        parse_error=flag("parse_error"),
        had_429=flag("had_429"),
        batch=int_param(request, "batch"),
    )


def filter_params(where: RequestFilter) -> dict[str, Any]:
    found: dict[str, Any] = {name: getattr(where, name) for name in TEXT_FILTERS}
    found.update({name: "1" if getattr(where, name) else None for name in FLAG_FILTERS})
    found["batch"] = where.batch
    return found


def routes(web: Web) -> list[BaseRoute]:
    def request_list(request: Request) -> Response:
        where = filter_of(request)
        before = int_param(request, "before")
        page = web.store.request_page(where, before=before)
        context = {
            "page": page,
            "filters": filter_params(where),
            "before": before,
            "statuses": [s.value for s in RequestStatus],
            "deliveries": [d.value for d in Delivery],
            "finish_reasons": FINISH_REASONS,
            "pools": web.store.known_pools(),
            # A custom_id searched for whole is found at once, wherever the pages' walk is.
            "exact": web.store.request_by_custom_id(where.q) if where.q else None,
        }
        return web.render(request, "requests.html", context)

    def export_jsonl(request: Request) -> Response:
        where = filter_of(request)

        def lines() -> Iterator[str]:
            for row in web.store.export_requests(where):
                shown = {k: redact(v) if isinstance(v, dict | list) else v for k, v in row.items()}
                yield json.dumps(shown, default=str, ensure_ascii=False) + "\n"

        headers = {"Content-Disposition": 'attachment; filename="requests.jsonl"'}
        return StreamingResponse(lines(), media_type="application/x-ndjson", headers=headers)

    def export_csv(request: Request) -> Response:
        where = filter_of(request)

        def lines() -> Iterator[str]:
            buffer = io.StringIO()
            writer = csv.writer(buffer)
            writer.writerow(CSV_COLUMNS)
            for i, row in enumerate(web.store.export_requests(where)):
                writer.writerow([_csv_cell(row.get(name)) for name in CSV_COLUMNS])
                if i % 500 == 0:
                    yield buffer.getvalue()
                    buffer.seek(0)
                    buffer.truncate()
            yield buffer.getvalue()

        headers = {"Content-Disposition": 'attachment; filename="requests.csv"'}
        return StreamingResponse(lines(), media_type="text/csv; charset=utf-8", headers=headers)

    def request_page(request: Request) -> Response:
        request_id = int(request.path_params["request_id"])
        found = web.store.get_request(request_id)
        if found is None:
            return web.not_found(f"request {request_id}")
        attempts = found.pop("attempt_rows")
        batch = web.store.get_batch(found["batch_id"]) if found.get("batch_id") is not None else None
        context = {
            "r": found,
            "attempts": attempts,
            "batch": batch,
            "verdict": verdict_parts(found.get("raw_output"), found.get("verdict_text")),
            "opinions": web.store.request_opinions(request_id),
            "lineage": web.store.sources_of(request_id),
        }
        return web.render(request, "request.html", context)

    return [
        Route("/requests", request_list),
        Route("/requests/export.jsonl", export_jsonl),
        Route("/requests/export.csv", export_csv),
        Route("/requests/{request_id:int}", request_page),
    ]


def verdict_parts(raw: str | None, verdict: str | None) -> tuple[str, str, str] | None:
    """The raw output split around its VERDICT line (before, the line, after), for the page to
    highlight the line as text; None when there is no such line in it."""
    if not raw or not verdict:
        return None
    at = raw.rfind(verdict)
    if at < 0:
        return None
    return raw[:at], raw[at : at + len(verdict)], raw[at + len(verdict) :]


def _csv_cell(value: Any) -> str:
    """A cell as text; one that a spreadsheet would run as a formula gets a leading quote."""
    if value is None:
        return ""
    text = json.dumps(value, default=str) if isinstance(value, dict | list) else str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text
