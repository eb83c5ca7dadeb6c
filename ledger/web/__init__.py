"""`ledger web`: a live, read-mostly web view of the ledger (jobs and their score matrix, requests
with every attempt, pools, batches, spend over time).

Its own package so that nothing else imports a web stack: `base` and `formats` are the shared
pieces the `pages_*` modules (one area each) and `actions` build on, `app` composes them into the
Starlette application, `security` guards it (host check, token, CSRF, headers), `live` announces
changes over server-sent events, `server` binds and runs it.
It reads through `ledger.store` only (`BrowseQueries` and the queries the CLI uses); everything a
model or a stage wrote is escaped by Jinja's autoescape and no page carries an inline script.
"""

from __future__ import annotations

from ledger.web.app import create_app
from ledger.web.base import WebConfig

__all__ = ["WebConfig", "create_app"]
