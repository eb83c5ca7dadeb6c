"""The three actions, only with `ledger web --allow-actions`: cancel a job, cancel a provider
batch, resume a paused pool. Each is a POST carrying the page's CSRF token (a form of this
server's own pages), and does what the command line does (`ledger cancel --job / --batch`,
`ledger pools resume`). Without --allow-actions they answer 403 and no page shows a button."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from ledger.web.base import Web, plain
from ledger.web.formats import segment
from ledger.web.security import host_name

READ_ONLY = "read-only: start `ledger web --allow-actions` to cancel jobs and batches or resume pools\n"


def routes(web: Web) -> list[BaseRoute]:
    def guarded(act: Callable[[Request], str]) -> Callable[[Request], Awaitable[Response]]:
        async def handler(request: Request) -> Response:
            if not web.config.allow_actions:
                return plain(READ_ONLY, 403)
            origin = request.headers.get("origin")
            if origin and host_name(origin.split("://", 1)[-1]) != host_name(request.headers.get("host", "")):
                return plain("cross-site request refused\n", 403)
            form = await request.form()
            given = form.get("csrf")
            if not web.guard.csrf_ok(given if isinstance(given, str) else None):
                return plain("missing or wrong CSRF token: reload the page and try again\n", 403)
            back = await run_in_threadpool(act, request)
            return RedirectResponse(back, status_code=303)

        return handler

    def cancel_job(request: Request) -> str:
        from ledger.cancel import cancel

        job_id = request.path_params["job_id"]
        if web.store.get_job(job_id) is not None:
            list(cancel(web.store, web.settings, job_id=job_id))  # what `ledger cancel --job` does
        return f"/jobs/{segment(job_id)}"

    def cancel_batch(request: Request) -> str:
        from ledger.cancel import cancel

        batch_id = int(request.path_params["batch_id"])
        if web.store.get_batch(batch_id) is not None:
            list(cancel(web.store, web.settings, batch_id=batch_id))
        return "/batches"

    def resume_pool(request: Request) -> str:
        web.store.resume_pool(request.path_params["pool"])
        return "/"

    return [
        Route("/jobs/{job_id}/cancel", guarded(cancel_job), methods=["POST"]),
        Route("/batches/{batch_id:int}/cancel", guarded(cancel_batch), methods=["POST"]),
        Route("/pools/{pool:path}/resume", guarded(resume_pool), methods=["POST"]),
    ]
