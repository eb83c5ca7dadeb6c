"""The mock provider's batch routes: OpenAI Files + Batch API, Anthropic Message Batches.

Just enough state for the real SDKs to run a batch round trip: files are kept
in memory, a batch is answered line by line with the same deterministic answers
as the online routes, and its status moves on with time (`batch_latency`)
whenever it is read. Anthropic's `results_url` points back at this server.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.parser import BytesParser
from email.policy import default as email_policy
from typing import TYPE_CHECKING, Any

from adapters.mock_answers import chat_answer, directives, prompt_text

if TYPE_CHECKING:
    from adapters.mock_server import MockProviderServer, Reply


def _rfc3339(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z") if ts is not None else None


@dataclass
class StoredFile:
    id: str
    filename: str
    purpose: str
    content: bytes
    created_at: int = field(default_factory=lambda: int(time.time()))

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.content),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
        }


@dataclass
class Batch:
    id: str
    kind: str  # "openai" | "anthropic"
    requests: list[dict[str, Any]]
    created: float = field(default_factory=time.time)
    endpoint: str = "/v1/chat/completions"
    input_file_id: str | None = None
    canceled_at: float | None = None
    results: list[dict[str, Any]] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None


class BatchStore:
    def __init__(self, server: MockProviderServer) -> None:
        self.server = server
        self.files: dict[str, StoredFile] = {}
        self.batches: dict[str, Batch] = {}

    def route(self, method: str, path: str, body: bytes, headers: dict[bytes, bytes], host: str) -> Reply | None:
        from adapters.mock_server import Reply, json_reply

        parts = path.strip("/").split("/")
        if method == "POST" and path == "/v1/files":
            return json_reply(200, self._upload(body, headers.get(b"content-type", b"").decode()).describe())
        if parts[:2] == ["v1", "files"] and len(parts) >= 3 and parts[2] in self.files:
            stored = self.files[parts[2]]
            if len(parts) == 4 and parts[3] == "content":
                return Reply(200, stored.content, content_type="application/octet-stream")
            return json_reply(200, stored.describe())
        if method == "POST" and path == "/v1/batches":
            return json_reply(200, self._openai_create(json.loads(body)))
        if parts[:2] == ["v1", "batches"] and len(parts) >= 3 and parts[2] in self.batches:
            batch = self.batches[parts[2]]
            if method == "POST" and parts[-1] == "cancel":
                batch.canceled_at = batch.canceled_at or time.time()
            return json_reply(200, self._openai_view(batch))
        if method == "POST" and path == "/v1/messages/batches":
            batch = self._new("anthropic", json.loads(body)["requests"])
            return json_reply(200, self._anthropic_view(batch, host))
        if parts[:3] == ["v1", "messages", "batches"] and len(parts) >= 4 and parts[3] in self.batches:
            batch = self.batches[parts[3]]
            if method == "POST" and parts[-1] == "cancel":
                batch.canceled_at = batch.canceled_at or time.time()
            if parts[-1] == "results":
                self._finish(batch)
                lines = "".join(json.dumps(r) + "\n" for r in batch.results or [])
                return Reply(200, lines.encode(), content_type="application/x-jsonl")
            return json_reply(200, self._anthropic_view(batch, host))
        return None

    def _upload(self, body: bytes, content_type: str) -> StoredFile:
        message = BytesParser(policy=email_policy).parsebytes(
            b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body
        )
        fields: dict[str, Any] = {}
        filename = "upload.jsonl"
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            given = part.get_filename()
            if given:
                filename = given
            fields[str(name)] = part.get_payload(decode=True)
        stored = StoredFile(
            f"file-{uuid.uuid4().hex[:24]}",
            filename,
            (fields.get("purpose") or b"batch").decode(),
            fields.get("file") or b"",
        )
        self.files[stored.id] = stored
        return stored

    def _new(self, kind: str, requests: list[dict[str, Any]], **extra: Any) -> Batch:
        prefix = "batch_" if kind == "openai" else "msgbatch_"
        batch = Batch(f"{prefix}{uuid.uuid4().hex[:24]}", kind, requests, **extra)
        self.batches[batch.id] = batch
        return batch

    def _openai_create(self, payload: dict[str, Any]) -> dict[str, Any]:
        source = self.files[payload["input_file_id"]]
        lines = [json.loads(line) for line in source.content.decode().splitlines() if line.strip()]
        batch = self._new(
            "openai", lines, endpoint=payload.get("endpoint", "/v1/chat/completions"), input_file_id=source.id
        )
        return self._openai_view(batch)

    def _done(self, batch: Batch) -> bool:
        return time.time() - batch.created >= self.server.config.batch_latency

    def _finish(self, batch: Batch) -> None:
        """Answer every request of a batch once (the same answers as online calls)."""
        if batch.results is not None:
            return
        batch.results = [self._answer(batch, request) for request in batch.requests]
        if batch.kind == "openai":
            ok = [r for r in batch.results if r["error"] is None and r["response"]["status_code"] == 200]
            bad = [r for r in batch.results if r not in ok]
            batch.output_file_id = self._file(batch, "output", ok)
            batch.error_file_id = self._file(batch, "errors", bad) if bad else None

    def _file(self, batch: Batch, name: str, rows: list[dict[str, Any]]) -> str:
        stored = StoredFile(
            f"file-{uuid.uuid4().hex[:24]}",
            f"{batch.id}_{name}.jsonl",
            "batch_output",
            "".join(json.dumps(r) + "\n" for r in rows).encode(),
        )
        self.files[stored.id] = stored
        return stored.id

    def _answer(self, batch: Batch, request: dict[str, Any]) -> dict[str, Any]:
        params = request.get("body") if batch.kind == "openai" else request.get("params")
        params = params or {}
        system, messages = params.get("system"), params.get("messages", [])
        found = directives(prompt_text(system, messages))
        status = int(found["fail"].partition("x")[0]) if "fail" in found else 200
        if batch.kind == "anthropic":
            if status != 200:
                result: dict[str, Any] = {
                    "type": "errored",
                    "error": {
                        "type": "error",
                        "error": {"type": "invalid_request_error", "message": f"injected {status}"},
                    },
                }
            elif batch.canceled_at is not None:
                result = {"type": "canceled"}
            else:
                answer = chat_answer(params.get("model", "mock"), system, messages, None)
                from adapters.mock_server import anthropic_message

                result = {
                    "type": "succeeded",
                    "message": anthropic_message(
                        params.get("model", "mock"), answer.text, answer.input_tokens, answer.output_tokens
                    ),
                }
            return {"custom_id": request.get("custom_id"), "result": result}
        from adapters.mock_server import openai_completion

        body: dict[str, Any]
        if status == 200:
            answer = chat_answer(params.get("model", "mock"), system, messages, params.get("response_format"))
            body = openai_completion(
                params.get("model", "mock"), answer.text, answer.input_tokens, answer.output_tokens
            )
        else:
            body = {"error": {"message": f"injected {status}", "type": "invalid_request_error"}}
        return {
            "id": f"batch_req_{uuid.uuid4().hex[:20]}",
            "custom_id": request.get("custom_id"),
            "response": {"status_code": status, "request_id": uuid.uuid4().hex, "body": body},
            "error": None,
        }

    def _openai_view(self, batch: Batch) -> dict[str, Any]:
        total = len(batch.requests)
        done = self._done(batch) or batch.canceled_at is not None
        if done:
            self._finish(batch)
        failed = sum(1 for r in batch.results or [] if r["response"]["status_code"] != 200)
        status = "cancelled" if batch.canceled_at is not None else "completed" if done else "in_progress"
        created = int(batch.created)
        return {
            "id": batch.id,
            "object": "batch",
            "endpoint": batch.endpoint,
            "errors": None,
            "input_file_id": batch.input_file_id,
            "completion_window": "24h",
            "status": status,
            "output_file_id": batch.output_file_id if done else None,
            "error_file_id": batch.error_file_id if done else None,
            "created_at": created,
            "in_progress_at": created,
            "expires_at": created + 86400,
            "finalizing_at": int(time.time()) if done else None,
            "completed_at": int(time.time()) if status == "completed" else None,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": int(batch.canceled_at) if batch.canceled_at else None,
            "request_counts": {
                "total": total,
                "completed": total - failed if done else 0,
                "failed": failed if done else 0,
            },
            "metadata": None,
        }

    def _anthropic_view(self, batch: Batch, host: str) -> dict[str, Any]:
        done = self._done(batch) or batch.canceled_at is not None
        if done:
            self._finish(batch)
        results = batch.results or []
        count = {
            kind: sum(1 for r in results if r["result"]["type"] == kind)
            for kind in ("succeeded", "errored", "canceled", "expired")
        }
        return {
            "id": batch.id,
            "type": "message_batch",
            "processing_status": "ended" if done else "in_progress",
            "request_counts": {"processing": 0 if done else len(batch.requests), **count},
            "ended_at": _rfc3339(time.time()) if done else None,
            "created_at": _rfc3339(batch.created),
            "expires_at": _rfc3339(batch.created + 86400),
            "archived_at": None,
            "cancel_initiated_at": _rfc3339(batch.canceled_at),
            "results_url": f"http://{host}/v1/messages/batches/{batch.id}/results" if done else None,
        }
