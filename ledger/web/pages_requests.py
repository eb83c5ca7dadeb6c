"""`/requests` (filters, keyset pages, export of the filtered set as JSONL or CSV) and
`/requests/{id}` (everything the ledger holds on one request, its attempts as a timeline)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from adapters.base import FINISH_REASONS
from adapters.registry import PROVIDER_NAMES
from ledger.statuses import Delivery, RequestStatus
from ledger.store.browse import REQUEST_LIST_COLUMNS, RequestFilter
from ledger.web.base import Web, int_param, plain
from ledger.web.formats import redact

TEXT_FILTERS = ("status", "job", "pool", "provider", "model", "delivery", "finish_reason", "q")
FLAG_FILTERS = ("parse_error", "had_429")
# The filters that take one of a fixed list of values.
FIXED_FILTERS: dict[str, tuple[str, ...]] = {
    "status": tuple(s.value for s in RequestStatus),
    "provider": tuple(sorted(PROVIDER_NAMES)),
    "delivery": tuple(d.value for d in Delivery),
    "finish_reason": FINISH_REASONS,
}
# The columns of the CSV export: a request list's, and when it ended (the JSONL export has every
# column but the input and the body).
CSV_COLUMNS = (*REQUEST_LIST_COLUMNS, "completed_at")


class BadFilter(ValueError):
    """A filter given a value it cannot take (one line naming it, the value and what it takes):
    answered 400, where matching nothing would look like an answer."""


def filter_of(request: Request) -> RequestFilter:
    q = request.query_params
    for name, allowed in FIXED_FILTERS.items():
        value = q.get(name)
        if value and value not in allowed:
            shown = name.replace("_", " ")
            raise BadFilter(f"{name}={value[:100]!r} is not a {shown}: one of {', '.join(allowed)}")
    if q.get("batch") and int_param(request, "batch") is None:
        raise BadFilter(f"batch={q['batch'][:100]!r} is not a batch id: a whole number")

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
    def request_list(request: Request, where: RequestFilter) -> Response:
        before = int_param(request, "before")
        page = web.store.request_page(where, before=before)
        context = {
            "page": page,
            "filters": filter_params(where),
            "before": before,
            "statuses": FIXED_FILTERS["status"],
            "providers": FIXED_FILTERS["provider"],
            "deliveries": FIXED_FILTERS["delivery"],
            "finish_reasons": FIXED_FILTERS["finish_reason"],
            "pools": web.store.known_pools(),
            # A custom_id searched for whole is found at once, wherever the pages' walk is.
            "exact": web.store.request_by_custom_id(where.q) if where.q else None,
        }
        return web.render(request, "requests.html", context)

    def export_jsonl(request: Request, where: RequestFilter) -> Response:

        def lines() -> Iterator[str]:
            for row in web.store.export_requests(where):
                shown = {k: redact(v) if isinstance(v, dict | list) else v for k, v in row.items()}
                yield json.dumps(shown, default=str, ensure_ascii=False) + "\n"

        headers = {"Content-Disposition": 'attachment; filename="requests.jsonl"'}
        return StreamingResponse(lines(), media_type="application/x-ndjson", headers=headers)

    def export_csv(request: Request, where: RequestFilter) -> Response:

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
        Route("/requests", filtered(request_list)),
        Route("/requests/export.jsonl", filtered(export_jsonl)),
        Route("/requests/export.csv", filtered(export_csv)),
        Route("/requests/{request_id:int}", request_page),
    ]


def filtered(handler: Callable[[Request, RequestFilter], Response]) -> Callable[[Request], Response]:
    """`handler` given the request's filters, or a 400 saying which filter is wrong."""

    def run(request: Request) -> Response:
        try:
            where = filter_of(request)
        except BadFilter as exc:
            return plain(str(exc), 400)
        return handler(request, where)

    return run


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
