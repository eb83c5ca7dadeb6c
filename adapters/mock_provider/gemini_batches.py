"""The mock provider's Gemini Files and Batch routes, enough for `google-genai` to run a batch:
a resumable upload (start, then the bytes), `models/{model}:batchGenerateContent`, the batch
read, listed and cancelled as a long-running operation, and the responses file downloaded.

Batches share the Batch store with OpenAI's and Anthropic's (their lines' fates, time passing,
the per-prompt directives of `batches.py`); what is Gemini's is the shape of things: files named
`files/...`, batches `batches/...`, states `BATCH_STATE_*`, an input line `{"key", "request"}`
and a result line `{"key", "response"}` or `{"key", "error"}`. An expired batch answers the lines
it reached and leaves the others out of its responses file; a canceled one too.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from adapters.mock_provider import checks, gemini_wire
from adapters.mock_provider.openai_checks import Refusal
from adapters.mock_provider.wire import Reply, error_reply, json_reply

if TYPE_CHECKING:
    from adapters.mock_provider.batches import Batch, BatchStore, StoredFile

_GENERATE_BATCH = "type.googleapis.com/google.ai.generativelanguage.v1main.GenerateContentBatch"


def _rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1e6):06d}Z"


class GeminiBatchRoutes:
    def __init__(self, store: BatchStore) -> None:
        self.store = store
        self.uploads: dict[str, tuple[str, bytearray]] = {}  # upload id -> (display name, bytes so far)

    def route(
        self, method: str, rest: str, query: dict[str, str], body: bytes, headers: dict[bytes, bytes], host: str
    ) -> Reply | None:
        """`rest`: the path after its version (`files`, `batches/x:cancel`, ...)."""
        if method == "POST" and rest == "files":
            return self._upload(query, body, headers, host)
        if rest.startswith("files/"):
            return self._file(method, rest.removeprefix("files/"), host)
        if method == "POST" and rest.startswith("models/") and rest.endswith(":batchGenerateContent"):
            model = rest.removeprefix("models/").removesuffix(":batchGenerateContent")
            return self._create(model, json.loads(body).get("batch") or {})
        if method == "GET" and rest == "batches":
            return self._list(query)
        if rest.startswith("batches/"):
            batch_id, _, verb = rest.removeprefix("batches/").partition(":")
            batch = self.store.batches.get(f"batches/{batch_id}")
            if batch is None or batch.kind != "gemini":
                return error_reply("gemini", 404, "not_found", f"batch {batch_id} not found")
            if method == "POST" and verb == "cancel":
                self.store.cancel(batch)
                return json_reply(200, {})
            return json_reply(200, self.view(batch))
        return None

    # -- files -------------------------------------------------------------------

    def _upload(self, query: dict[str, str], body: bytes, headers: dict[bytes, bytes], host: str) -> Reply:
        command = headers.get(b"x-goog-upload-command", b"").decode().lower()
        if "start" in command:
            upload_id = uuid.uuid4().hex
            described = (json.loads(body or b"{}").get("file") or {}) if body else {}
            self.uploads[upload_id] = (str(described.get("displayName") or "upload.jsonl"), bytearray())
            url = f"http://{host}/upload/v1beta/files?upload_id={upload_id}&upload_protocol=resumable"
            return Reply(200, b"{}", [("x-goog-upload-url", url), ("x-goog-upload-status", "active")])
        pending = self.uploads.get(query.get("upload_id", ""))
        if pending is None:
            return error_reply("gemini", 404, "not_found", "no such upload")
        pending[1].extend(body)
        if "finalize" not in command:
            return Reply(200, b"", [("x-goog-upload-status", "active")])
        del self.uploads[query["upload_id"]]
        stored = self.store.add_file(pending[0], bytes(pending[1]), "gemini_upload", prefix="")
        return json_reply(200, {"file": describe(stored, host)}, [("x-goog-upload-status", "final")])

    def _file(self, method: str, rest: str, host: str) -> Reply:
        file_id, _, verb = rest.partition(":")
        stored = self.store.files.get(file_id)
        if stored is None:
            return error_reply("gemini", 404, "not_found", f"file files/{file_id} not found")
        if method == "DELETE":
            del self.store.files[file_id]
            self.store.deleted.add(file_id)
            return json_reply(200, {})
        if verb == "download":
            return self.store.download(file_id, stored.content, "application/octet-stream")
        return json_reply(200, describe(stored, host))

    # -- batches -------------------------------------------------------------------

    def _output(self, batch: Batch) -> dict[str, Any]:
        """Where an ended batch's answers are: its responses file, or inline for inline requests."""
        if not (batch.metadata or {}).get("inline"):
            return {"responsesFile": f"files/{batch.output_file_id}"}
        inlined = []
        for line in batch.results or []:
            if line:
                answered = {k: v for k, v in line.items() if k != "key"}
                inlined.append(answered | {"metadata": {"key": line["key"]}})
        return {"inlinedResponses": {"inlinedResponses": inlined}}

    def _create(self, model: str, asked: dict[str, Any]) -> Reply:
        """A batch of a file's lines (`{"key", "request"}`) or of inline requests (`{"request",
        "metadata"}`); a request Gemini refuses answers its error in its result line."""
        config = asked.get("inputConfig") or {}
        inline = (config.get("requests") or {}).get("requests")
        name = str(config.get("fileName") or "")
        if isinstance(inline, list):
            entries = [{"key": str((e.get("metadata") or {}).get("key") or i), **e} for i, e in enumerate(inline)]
        else:
            source = self.store.files.get(name.removeprefix("files/"))
            if source is None:
                return error_reply("gemini", 400, "invalid_request", f"inputConfig.fileName {name!r}: no such file")
            entries = [json.loads(line) for line in source.content.decode().splitlines() if line.strip()]
        requests: list[dict[str, Any]] = []
        refusals: list[Refusal | None] = []
        for entry in entries:
            refusal = _entry_refusal(entry)
            request: dict[str, Any] = entry["request"] if refusal is None else {"contents": []}
            requests.append({"custom_id": entry.get("key"), "params": gemini_wire.as_chat(request, model)})
            refusals.append(refusal)
        batch, stall = self.store.plan(
            "gemini",
            requests,
            refusals,
            input_file_id=name or None,
            metadata={"displayName": asked.get("displayName"), "model": model, "inline": isinstance(inline, list)},
        )
        self.store.accept(batch)
        reply = json_reply(200, self.view(batch))
        reply.delay = stall
        return reply

    def _list(self, query: dict[str, str]) -> Reply:
        """Newest first, `pageSize` at a time, `pageToken` the next page's first batch."""
        ordered = [b for b in reversed(self.store.batches.values()) if b.kind == "gemini"]
        start = int(query.get("pageToken") or 0)
        size = int(query.get("pageSize") or 50)
        page = ordered[start : start + size]
        listed: dict[str, Any] = {"operations": [self.view(b) for b in page]}
        if start + size < len(ordered):
            listed["nextPageToken"] = str(start + size)
        return json_reply(200, listed)

    def state(self, batch: Batch) -> str:
        if not self.store.ended(batch):
            return "BATCH_STATE_RUNNING"
        if batch.canceled_at is not None:
            return "BATCH_STATE_CANCELLED"
        if batch.invalid_lines:
            return "BATCH_STATE_FAILED"
        return "BATCH_STATE_EXPIRED" if batch.expires else "BATCH_STATE_SUCCEEDED"

    def view(self, batch: Batch) -> dict[str, Any]:
        """A batch as Gemini shows it: a long-running operation whose metadata is the batch."""
        state = self.state(batch)
        ended = state != "BATCH_STATE_RUNNING"
        meta = batch.metadata or {}
        metadata: dict[str, Any] = {
            "@type": _GENERATE_BATCH,
            "name": batch.id,
            "model": f"models/{meta.get('model')}",
            "displayName": meta.get("displayName"),
            "inputConfig": {"fileName": batch.input_file_id} if batch.input_file_id else {},
            "createTime": _rfc3339(batch.created),
            "updateTime": _rfc3339(time.time()),
            "state": state,
        }
        total = len(batch.lines)
        if ended:
            if state != "BATCH_STATE_FAILED":
                self.store.finish(batch)
                metadata["output"] = self._output(batch)
            answered = [r for r in batch.results or [] if r]
            failed = sum(1 for r in answered if "error" in r)
            metadata["endTime"] = _rfc3339(time.time())
            metadata["batchStats"] = {
                "requestCount": str(total),
                "successfulRequestCount": str(len(answered) - failed),
                "failedRequestCount": str(failed),
                "pendingRequestCount": str(total - len(answered)),
            }
        else:
            metadata["batchStats"] = {"requestCount": str(total), "pendingRequestCount": str(total)}
        return {"name": batch.id, "metadata": metadata, "done": ended}


def _entry_refusal(entry: Any) -> Refusal | None:
    """Why Gemini refuses a batch entry: not `{"key", "request"}` (inline: `metadata` too), or its
    request refused as a `generateContent` body is."""
    if not isinstance(entry, dict) or "request" not in entry:
        return Refusal('Invalid JSON payload received. Each request needs a "request".')
    for name in entry:
        if name not in ("key", "request", "metadata"):
            return Refusal(f'Invalid JSON payload received. Unknown name "{name}": Cannot find field.')
    return checks.check("gemini", entry["request"])


def describe(stored: StoredFile, host: str) -> dict[str, Any]:
    described = {
        "name": f"files/{stored.id}",
        "displayName": stored.filename,
        "mimeType": "application/jsonl",
        "sizeBytes": str(len(stored.content)),
        "createTime": _rfc3339(stored.created_at),
        "updateTime": _rfc3339(stored.created_at),
        "expirationTime": _rfc3339(stored.created_at + 48 * 3600),
        "uri": f"http://{host}/v1beta/files/{stored.id}",
        "state": "ACTIVE",
        "source": "UPLOADED" if stored.purpose == "gemini_upload" else "GENERATED",
    }
    if stored.purpose != "gemini_upload":
        described["downloadUri"] = f"http://{host}/v1beta/files/{stored.id}:download?alt=media"
    return described
