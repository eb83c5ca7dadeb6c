"""The mock provider's batch routes: OpenAI Files + Batch API, Anthropic Message Batches.

Just enough state for the real SDKs to run a batch round trip: files are kept
in memory, a batch is answered line by line with the same deterministic answers
as the online routes, and its status moves on with time whenever it is read
(in progress for `batch_latency`, then finalizing for `batch_finalize_seconds`).
Anthropic's `results_url` points back at this server.

Faults, by flag (a rate per batch or per line) or by directive in a prompt
(counted per prompt across batches, like the online `fail=503x2`):

    [[mock:fail=500x1]]      this line errors (status 500) in the first batch that carries it
    [[mock:expire]]          a batch carrying it ends `expired`; this line gets no result,
                             the others do (partial results); `expire=N`: its first N batches
    [[mock:invalid]]         the batch fails validation at this line (OpenAI: status `failed`
                             with the line number; Anthropic: the create call answers 400)
    [[mock:create_stall=S]]  the create call registers the batch, then answers S seconds later

Flags: `batch_expire_rate` (the batch expires; every other line gets no result),
`batch_fail_rate` (validation failure of the whole batch), `batch_line_error_rate`
(a line answers 500), `batch_create_stall`, `batch_results_stall` (the first
download of each result file stops half-way for that long), `batch_cancel_ended_refused`
(a cancel of a batch that has ended answers 400, as a provider may).
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.parser import BytesParser
from email.policy import default as email_policy
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from adapters.mock_provider import anthropic_checks, checks, gemini_wire, openai_checks
from adapters.mock_provider.answers import directives, model_answer, prompt_key, prompt_text, request_prompt
from adapters.mock_provider.openai_checks import Refusal
from adapters.mock_provider.wire import Answered, Reply, answer_body, azure_model, error_reply, json_reply

if TYPE_CHECKING:
    from adapters.mock_provider.config import MockProviderConfig


def _wire(batch: Batch) -> str:
    """The wire format of a batch's lines: Anthropic's, or OpenAI's chat or Responses API."""
    if batch.kind in ("anthropic", "gemini"):
        return batch.kind
    return "responses" if batch.endpoint.rstrip("/").endswith("/responses") else "chat"


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    """Rows as JSON lines; `{}` rows (lines a batch did not reach) left out."""
    return "".join(json.dumps(r) + "\n" for r in rows if r).encode()


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
class LinePlan:
    """What becomes of one request of a batch, decided when the batch is created."""

    custom_id: str
    params: dict[str, Any]
    status: int = 200  # 200, or the error status this line answers with
    refusal: Refusal | None = None  # why the provider refuses this request (status 400)
    unfinished: bool = False  # no result: the batch expires (or is canceled) before reaching it


@dataclass
class Batch:
    id: str
    kind: str  # "openai" | "anthropic" | "gemini"
    lines: list[LinePlan]
    created: float = field(default_factory=time.time)
    endpoint: str = "/v1/chat/completions"
    input_file_id: str | None = None
    metadata: dict[str, Any] | None = None
    expires: bool = False
    invalid_lines: list[int] = field(default_factory=list)  # 0-based
    line_errors: dict[int, dict[str, Any]] = field(default_factory=dict)  # why a line failed validation
    canceled_at: float | None = None
    finished_share: float = 1.0  # of the lines, answered before a cancel came
    results: list[dict[str, Any]] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    azure: bool = False  # created through Azure's paths: its answers name the deployment's model


class BatchStore:
    def __init__(
        self,
        config: MockProviderConfig,
        rng: Any,
        prompt_cache: set[str] | None = None,
        answered: Answered | None = None,
    ) -> None:
        self.config = config
        self.rng = rng
        self.prompt_cache = prompt_cache if prompt_cache is not None else set()  # the server's, shared
        self.answered = answered or Answered()
        self.files: dict[str, StoredFile] = {}
        self.batches: dict[str, Batch] = {}
        self.seen: Counter[str] = Counter()  # per prompt: batches that carried it
        self.creates: Counter[str] = Counter()  # batches accepted, per wire
        self.downloaded: set[str] = set()  # files and results downloaded at least once
        self.deleted: set[str] = set()  # files deleted by their owner
        self.refused_uploads = 0  # uploads refused as the provider would
        self.uploaded_names: list[str] = []  # the names uploads were taken under (deleted ones too)
        self.refused_lines = 0  # batch lines whose request the provider would refuse

    def stats(self) -> dict[str, Any]:
        return {
            "batch_creates": dict(self.creates),
            "batch_ids": list(self.batches),
            "batch_lines": sum(self.seen.values()),  # lines answered in batches (retries included)
            "files": sorted(self.files),  # every file still stored (uploads, outputs, error files)
            "deleted_files": sorted(self.deleted),
            "refused_uploads": self.refused_uploads,
            "uploaded_names": list(self.uploaded_names),
            "refused_lines": self.refused_lines,
        }

    def reset(self) -> None:
        self.creates.clear()

    def route(self, method: str, target: str, body: bytes, headers: dict[bytes, bytes], host: str) -> Reply | None:
        path, _, query = target.partition("?")
        args = {k: v[0] for k, v in parse_qs(query).items()}
        azure = path.startswith(("/openai/files", "/openai/batches"))  # Azure OpenAI: OpenAI's API there
        if azure:
            path = "/v1/" + path.removeprefix("/openai/")
        parts = path.strip("/").split("/")
        if method == "DELETE" and parts[:2] == ["v1", "files"] and len(parts) == 3:
            found = self.files.pop(parts[2], None)
            if found is None:
                return error_reply("openai", 404, "invalid_request_error", f"no file {parts[2]}")
            self.deleted.add(found.id)
            return json_reply(200, {"id": found.id, "object": "file", "deleted": True})
        if method == "POST" and path == "/v1/files":
            return self._upload(body, headers.get(b"content-type", b"").decode())
        if parts[:2] == ["v1", "files"] and len(parts) >= 3 and parts[2] in self.files:
            stored = self.files[parts[2]]
            if len(parts) == 4 and parts[3] == "content":
                return self.download(stored.id, stored.content, "application/octet-stream")
            return json_reply(200, stored.describe())
        if method == "POST" and path == "/v1/batches":
            return self._openai_create(body, azure=azure)
        if method == "GET" and path == "/v1/batches":
            return json_reply(200, self._list("openai", args.get("after"), int(args.get("limit", 20)), host))
        if parts[:2] == ["v1", "batches"] and len(parts) >= 3 and parts[2] in self.batches:
            batch = self.batches[parts[2]]
            if method == "POST" and parts[-1] == "cancel" and not self.cancel(batch):
                return error_reply("openai", 400, "invalid_request_error", "the batch has ended: no cancel")
            return json_reply(200, self._openai_view(batch))
        if method == "POST" and path == "/v1/messages/batches":
            return self._anthropic_create(body, host)
        if method == "GET" and path == "/v1/messages/batches":
            return json_reply(200, self._list("anthropic", args.get("after_id"), int(args.get("limit", 20)), host))
        if parts[:3] == ["v1", "messages", "batches"] and len(parts) >= 4 and parts[3] in self.batches:
            batch = self.batches[parts[3]]
            if method == "POST" and parts[-1] == "cancel" and not self.cancel(batch):
                return error_reply("anthropic", 400, "invalid_request_error", "the batch has ended: no cancel")
            if parts[-1] == "results":
                if not self.ended(batch):
                    return error_reply("anthropic", 400, "invalid_request_error", "batch has not ended")
                self.finish(batch)
                assert batch.output_file_id is not None  # `finish` wrote it
                return self.download(batch.id, self.files[batch.output_file_id].content, "application/x-jsonl")
            return json_reply(200, self._anthropic_view(batch, host))
        return None

    def download(self, name: str, content: bytes, content_type: str) -> Reply:
        """A file or results download; with `batch_results_stall`, its first download pauses half-way."""
        stall = self.config.batch_results_stall
        first = name not in self.downloaded
        self.downloaded.add(name)
        if stall <= 0 or not content or not first:
            return Reply(200, content, content_type=content_type)
        half = content.rfind(b"\n", 0, len(content) // 2) + 1  # a line boundary near the middle
        return Reply(200, content, content_type=content_type, stall=(half, stall))

    def _upload(self, body: bytes, content_type: str) -> Reply:
        """A file stored, or refused as OpenAI refuses it: a batch input must be a `.jsonl` file."""
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
        purpose = (fields.get("purpose") or b"").decode()
        refusal = openai_checks.check_request("CreateFileRequest", {"file": "", "purpose": purpose})
        if refusal is None and purpose == "batch" and not filename.endswith(".jsonl"):
            refusal = Refusal(
                f"Invalid file format for Batch API: '{filename}'. Batch input files must be .jsonl files.", "file"
            )
        if refusal is not None:
            self.refused_uploads += 1
            return json_reply(400, checks.error_body("openai", refusal))
        stored = StoredFile(f"file-{uuid.uuid4().hex[:24]}", filename, purpose, fields.get("file") or b"")
        self.files[stored.id] = stored
        self.uploaded_names.append(filename)
        return json_reply(200, stored.describe())

    # -- creating --------------------------------------------------------------

    def plan(
        self, kind: str, requests: list[dict[str, Any]], refusals: list[Refusal | None] | None = None, **extra: Any
    ) -> tuple[Batch, float]:
        """A new batch with every line's fate decided now; and how long its create call stalls.
        `refusals`: per request, why its provider refuses it (that line answers its error)."""
        prefix = {"openai": "batch_", "anthropic": "msgbatch_", "gemini": "batches/"}[kind]
        batch = Batch(f"{prefix}{uuid.uuid4().hex[:24]}", kind, [], **extra)
        stall = self.config.batch_create_stall
        batch.expires = self.rng.random() < self.config.batch_expire_rate
        if self.rng.random() < self.config.batch_fail_rate:
            batch.invalid_lines = [0]
        for i, request in enumerate(requests):
            params = (request.get("body") if kind == "openai" else request.get("params")) or {}
            system, messages = request_prompt(_wire(batch), params)
            key = prompt_key(system, messages)
            self.seen[key] += 1
            found = directives(prompt_text(system, messages))
            line = LinePlan(str(request.get("custom_id")), params)
            if refusals is not None and refusals[i] is not None:
                line.status, line.refusal = 400, refusals[i]
                self.refused_lines += 1
            elif "fail" in found:
                status, _, times = found["fail"].partition("x")
                if times == "*" or self.seen[key] <= int(times or 1):
                    line.status = int(status)
            elif self.rng.random() < self.config.batch_line_error_rate:
                line.status = 500
            if "expire" in found and self.seen[key] <= int(found["expire"] or 1):
                batch.expires, line.unfinished = True, True
            if "invalid" in found:
                batch.invalid_lines.append(i)
            if "create_stall" in found:
                stall = max(stall, float(found["create_stall"]))
            batch.lines.append(line)
        if batch.expires and not any(line.unfinished for line in batch.lines):
            for line in batch.lines[1::2]:  # expired by the dice: every other line unfinished
                line.unfinished = True
        return batch, stall

    def accept(self, batch: Batch) -> None:
        self.batches[batch.id] = batch
        self.creates[batch.kind] += 1

    def _openai_create(self, body: bytes, azure: bool = False) -> Reply:
        """A batch created from an uploaded file. The create refuses a body OpenAI refuses; a file
        whose lines are not batch requests makes a `failed` batch (its errors name the lines); a
        line whose request the endpoint refuses answers that error in the batch's error file."""
        try:
            payload = json.loads(body)
        except ValueError:
            return json_reply(400, checks.error_body("openai", checks.unparsable("openai")))
        asked = dict(payload) if isinstance(payload, dict) else payload
        if azure and isinstance(asked, dict) and isinstance(asked.get("endpoint"), str):
            asked["endpoint"] = "/v1" + asked["endpoint"]  # Azure's paths have no /v1
        refusal = openai_checks.check_request("CreateBatchRequest", asked)
        if refusal is None and payload["input_file_id"] not in self.files:
            refusal = Refusal(f"No such File object: {payload['input_file_id']}", "input_file_id")
        if refusal is not None:
            return json_reply(400, checks.error_body("openai", refusal))
        source = self.files[payload["input_file_id"]]
        endpoint = str(payload["endpoint"])
        requests, refusals, line_errors = openai_lines(source.content, endpoint, azure)
        batch, stall = self.plan(
            "openai",
            requests,
            refusals,
            endpoint=endpoint,
            input_file_id=source.id,
            metadata=payload.get("metadata"),
            azure=azure,
        )
        if line_errors:
            batch.invalid_lines.extend(line_errors)
            batch.line_errors = line_errors
        self.accept(batch)
        reply = json_reply(200, self._openai_view(batch))
        reply.delay = stall
        return reply

    def _anthropic_create(self, body: bytes, host: str) -> Reply:
        """A Message Batch: its entries are checked at once (a bad entry refuses the create), each
        entry's `params` as the batch runs (a refused one ends `errored`)."""
        try:
            payload = json.loads(body)
        except ValueError:
            return json_reply(400, checks.error_body("anthropic", checks.unparsable("anthropic")))
        refusal = anthropic_checks.check_batch_create(payload)
        if refusal is not None:
            return json_reply(400, checks.error_body("anthropic", refusal))
        requests = payload["requests"]
        batch, stall = self.plan("anthropic", requests, [checks.check("anthropic", r["params"]) for r in requests])
        if batch.invalid_lines:  # Anthropic validates the whole request body up front
            first = sorted(batch.invalid_lines)[0]
            return error_reply(
                "anthropic", 400, "invalid_request_error", f"requests.{first}.params: invalid request (injected)"
            )
        self.accept(batch)
        reply = json_reply(200, self._anthropic_view(batch, host))
        reply.delay = stall
        return reply

    # -- time passing ----------------------------------------------------------

    def _elapsed(self, batch: Batch) -> float:
        return time.time() - batch.created

    def ended(self, batch: Batch) -> bool:
        finalize = self.config.batch_finalize_seconds
        if batch.invalid_lines:
            return True
        if batch.canceled_at is not None:
            return time.time() - batch.canceled_at >= finalize
        return self._elapsed(batch) >= self.config.batch_latency + finalize

    def cancel(self, batch: Batch) -> bool:
        """Cancel `batch` (again, or once it has ended: nothing changes); False when refused."""
        if self.ended(batch) and self.config.batch_cancel_ended_refused:
            return False
        if batch.canceled_at is not None or self.ended(batch):
            return True
        batch.canceled_at = time.time()
        latency = self.config.batch_latency
        batch.finished_share = min(1.0, self._elapsed(batch) / latency) if latency > 0 else 1.0
        return True

    def finish(self, batch: Batch) -> None:
        """Answer every request of an ended batch once (the same answers as online calls)."""
        if batch.results is not None:
            return
        finished = int(len(batch.lines) * batch.finished_share)
        batch.results = [
            self._result(batch, line, canceled=batch.canceled_at is not None and i >= finished)
            for i, line in enumerate(batch.lines)
        ]
        if batch.kind == "gemini":  # one responses file, of the lines answered
            batch.output_file_id = self.add_file(f"{batch.id}_responses.jsonl", _jsonl(batch.results), "", "").id
        elif batch.kind == "openai":
            ok: list[dict[str, Any]] = []
            bad: list[dict[str, Any]] = []
            for r in batch.results:
                if r.get("response") and r["response"]["status_code"] == 200:
                    ok.append(r)
                elif r.get("custom_id"):  # `{}`: a canceled line, in neither file
                    bad.append(r)
            batch.output_file_id = self._file(batch, "output", ok)
            # OpenAI writes an error file only when there are errors; Azure always does (empty).
            batch.error_file_id = self._file(batch, "errors", bad) if bad or batch.azure else None
        else:  # one results file, written once as the batch ends (a provider serves a finished file)
            batch.output_file_id = self._file(batch, "results", batch.results)

    def _file(self, batch: Batch, name: str, rows: list[dict[str, Any]]) -> str:
        return self.add_file(f"{batch.id}_{name}.jsonl", _jsonl(rows), "batch_output").id

    def add_file(self, filename: str, content: bytes, purpose: str, prefix: str = "file-") -> StoredFile:
        stored = StoredFile(f"{prefix}{uuid.uuid4().hex[:24]}", filename, purpose, content)
        self.files[stored.id] = stored
        return stored

    def _result(self, batch: Batch, line: LinePlan, canceled: bool) -> dict[str, Any]:
        """The result line of one request; `{}` (left out) for a canceled OpenAI line."""
        model = line.params.get("model", "mock")
        if batch.kind == "gemini":  # `{}`: left out of the responses file (not reached)
            if canceled or line.unfinished:
                return {}
            if line.refusal is not None:
                return {"key": line.custom_id, "error": checks.error_body("gemini", line.refusal)["error"]}
            if line.status != 200:
                failure = gemini_wire.error(line.status, f"injected {line.status}")
                return {"key": line.custom_id, "error": failure["error"]}
            answer = model_answer("gemini", line.params, self.prompt_cache)
            return {"key": line.custom_id, "response": self.answered.note(answer_body("gemini", model, answer))}
        if batch.kind == "anthropic":
            result: dict[str, Any]
            if canceled:
                result = {"type": "canceled"}
            elif line.unfinished:
                result = {"type": "expired"}
            elif line.refusal is not None:
                result = {"type": "errored", "error": checks.error_body("anthropic", line.refusal)}
            elif line.status != 200:
                error = {"type": "api_error" if line.status >= 500 else "invalid_request_error"}
                result = {"type": "errored", "error": {"type": "error", "error": error | {"message": "injected"}}}
            else:
                answer = model_answer("anthropic", line.params, self.prompt_cache)
                message = self.answered.note(answer_body("anthropic", model, answer))
                result = {"type": "succeeded", "message": message}
            return {"custom_id": line.custom_id, "result": result}
        if canceled:
            return {}  # OpenAI: a canceled batch's unfinished requests appear in neither file
        row: dict[str, Any] = {"id": f"batch_req_{uuid.uuid4().hex[:20]}", "custom_id": line.custom_id, "error": None}
        if line.unfinished:
            error = {"code": "batch_expired", "message": "This request could not be executed before the batch expired."}
            return row | {"response": None, "error": error}
        if line.refusal is not None:
            body: dict[str, Any] = checks.error_body("openai", line.refusal)
        elif line.status != 200:
            injected: dict[str, Any] = {"message": f"injected {line.status}", "type": "server_error"}
            body = {"error": injected | {"param": None, "code": "server_error"}}
        else:
            wire = _wire(batch)
            named = azure_model(model) if batch.azure and wire == "chat" else model
            answer = model_answer(wire, line.params, self.prompt_cache)
            body = self.answered.note(answer_body(wire, named, answer, line.params))
        return row | {"response": {"status_code": line.status, "request_id": uuid.uuid4().hex, "body": body}}

    # -- views -----------------------------------------------------------------

    def _list(self, kind: str, after: str | None, limit: int, host: str) -> dict[str, Any]:
        """Newest first; `after` an id: the page of older batches that follows it."""
        ordered = [b for b in reversed(self.batches.values()) if b.kind == kind]
        if after is not None:
            ids = [b.id for b in ordered]
            ordered = ordered[ids.index(after) + 1 :] if after in ids else []
        page = ordered[:limit]
        views = [self._openai_view(b) if kind == "openai" else self._anthropic_view(b, host) for b in page]
        first = page[0].id if page else None
        last = page[-1].id if page else None
        return {"object": "list", "data": views, "first_id": first, "last_id": last, "has_more": len(ordered) > limit}

    def _openai_status(self, batch: Batch) -> str:
        if batch.invalid_lines:
            return "failed"
        ended = self.ended(batch)
        if batch.canceled_at is not None:
            return "cancelled" if ended else "cancelling"
        if ended:
            return "expired" if batch.expires else "completed"
        return "in_progress" if self._elapsed(batch) < self.config.batch_latency else "finalizing"

    def _openai_view(self, batch: Batch) -> dict[str, Any]:
        total = len(batch.lines)
        status = self._openai_status(batch)
        ended = status in ("completed", "expired", "cancelled")
        if ended:
            self.finish(batch)
        results = [r for r in batch.results or [] if r]
        failed = sum(1 for r in results if r.get("error") or r["response"]["status_code"] != 200)
        created = int(batch.created)
        now = int(time.time())
        errors = None
        if batch.invalid_lines:
            injected = {"code": "invalid_request", "message": "invalid request (injected)", "param": "body"}
            data = [batch.line_errors.get(i, injected) | {"line": i + 1} for i in batch.invalid_lines]
            errors = {"object": "list", "data": data}
        view = {
            "id": batch.id,
            "object": "batch",
            "endpoint": batch.endpoint,
            "errors": errors,
            "input_file_id": batch.input_file_id,
            "completion_window": "24h",
            "status": status,
            "output_file_id": batch.output_file_id if ended else None,
            "error_file_id": batch.error_file_id if ended else None,
            "created_at": created,
            "in_progress_at": None if batch.invalid_lines else created,
            "expires_at": created + 86400,
            "finalizing_at": now if status in ("finalizing", "completed") else None,
            "completed_at": now if status == "completed" else None,
            "failed_at": now if status == "failed" else None,
            "expired_at": now if status == "expired" else None,
            "cancelling_at": int(batch.canceled_at) if batch.canceled_at else None,
            "cancelled_at": now if status == "cancelled" else None,
            "request_counts": {
                "total": total,
                "completed": len(results) - failed if ended else 0,
                "failed": failed if ended else 0,
            },
            "metadata": batch.metadata,
        }
        # The spec's Batch has no nulls: a time not reached yet (no errors, no file) is left out.
        return {key: value for key, value in view.items() if value is not None}

    def _anthropic_view(self, batch: Batch, host: str) -> dict[str, Any]:
        ended = self.ended(batch)
        if ended:
            self.finish(batch)
        results = batch.results or []
        count = {
            kind: sum(1 for r in results if r["result"]["type"] == kind)
            for kind in ("succeeded", "errored", "canceled", "expired")
        }
        status = "ended" if ended else "canceling" if batch.canceled_at is not None else "in_progress"
        return {
            "id": batch.id,
            "type": "message_batch",
            "processing_status": status,
            "request_counts": {"processing": 0 if ended else len(batch.lines), **count},
            "ended_at": _rfc3339(time.time()) if ended else None,
            "created_at": _rfc3339(batch.created),
            "expires_at": _rfc3339(batch.created + 86400),
            "archived_at": None,
            "cancel_initiated_at": _rfc3339(batch.canceled_at),
            "results_url": f"http://{host}/v1/messages/batches/{batch.id}/results" if ended else None,
        }


def openai_lines(
    content: bytes, endpoint: str, azure: bool = False
) -> tuple[list[dict[str, Any]], list[Refusal | None], dict[int, dict[str, Any]]]:
    """An OpenAI batch file read as OpenAI reads it: the requests, per request the refusal of its
    `body` by the endpoint's schema, and the lines that are not batch requests at all (0-based:
    a JSON object with `custom_id`, `method` POST and the batch's `url`), which fail the batch.
    `azure`: the lines' urls have no `/v1` (Azure's paths)."""
    wire = "responses" if endpoint.rstrip("/").endswith("/responses") else "chat"
    url = endpoint.removeprefix("/v1") if azure else endpoint
    requests: list[dict[str, Any]] = []
    refusals: list[Refusal | None] = []
    errors: dict[int, dict[str, Any]] = {}
    seen: set[str] = set()
    for i, text in enumerate(t for t in content.decode().splitlines() if t.strip()):
        try:
            line = json.loads(text)
        except ValueError:
            line = None
        problem = _line_problem(line, url, seen)
        if problem is not None:
            errors[i] = problem
            line = {"custom_id": None, "body": {}}
        requests.append(line)
        refusals.append(None if problem is not None else checks.check(wire, line["body"]))
    return requests, refusals, errors


def _line_problem(line: Any, url: str, seen: set[str]) -> dict[str, Any] | None:
    """Why a batch file's line is not a batch request (OpenAI's code, message, param), or None."""
    if not isinstance(line, dict):
        return {"code": "invalid_json_line", "message": "This line is not parseable as valid JSON.", "param": None}
    refusal = openai_checks.check_request("BatchRequestInput", {k: v for k, v in line.items() if k != "body"})
    for name in ("custom_id", "method", "url", "body"):
        if refusal is None and name not in line:
            refusal = Refusal(f"Missing required parameter: '{name}'.", name, "missing_required_parameter")
    if refusal is None and line["url"] != url:
        said = f"The url '{line['url']}' does not match the batch's endpoint '{url}'."
        refusal = Refusal(said, "url", "invalid_url")
    if refusal is None and line["custom_id"] in seen:
        said = f"The custom_id '{line['custom_id']}' is used by another line."
        refusal = Refusal(said, "custom_id", "duplicate_custom_id")
    if refusal is not None:
        return {"code": refusal.code or "invalid_request", "message": refusal.message, "param": refusal.param}
    seen.add(line["custom_id"])
    return None
