"""The mock provider as a program: `python -m adapters.mock_provider` (argparse, `main`) and the
serving loop `ledger mock-provider` shares (`serve_until_stopped`: one line naming the URL, then
until SIGTERM or SIGINT). Kept apart from `server.py`, which is the HTTP server itself.
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

import anyio

from adapters.mock_provider import checks
from adapters.mock_provider.config import MockProviderConfig, parse_fault_rates
from adapters.mock_provider.server import MockProviderServer

# What `--help` says the mock is (`python -m adapters.mock_provider` and `ledger mock-provider`).
DESCRIPTION = (
    "A mock LLM provider over real HTTP for keyless runs: OpenAI (chat, Responses, files, batches; "
    "also at Azure's paths), Anthropic and Gemini wire formats, with latency, caps and faults."
)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    def add_usage(self, usage: Any, actions: Any, groups: Any, prefix: str | None = None) -> None:
        super().add_usage(usage, actions, groups, prefix="Usage: ")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="ledger mock-provider",
        usage="%(prog)s [OPTIONS]",
        description=DESCRIPTION,
        formatter_class=_HelpFormatter,
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8089, help="port (0: a free one, named on the first line)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds each call takes")
    parser.add_argument("--jitter", type=float, default=0.0, help="up to this many seconds more, at random")
    parser.add_argument(
        "--max-concurrency", type=int, default=None, help="calls served at once; more get 429 with retry-after"
    )
    parser.add_argument("--rpm", type=int, default=None, help="requests per window; answers say what is left")
    parser.add_argument("--tpm", type=int, default=None, help="tokens answered per window; answers say what is left")
    parser.add_argument("--rpm-window", type=float, default=60.0, help="seconds the --rpm and --tpm caps count over")
    parser.add_argument("--rpm-model", default=None, help="the --rpm cap limits this model's calls only")
    parser.add_argument(
        "--proxy-headers",
        action="store_true",
        help="rate-limit headers as a LiteLLM proxy's: no reset; 429s with llm_provider-retry-after",
    )
    parser.add_argument(
        "--fault-rate", action="append", default=[], help="KIND=RATE, repeatable: share of calls failing with KIND"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random faults and jitter")
    parser.add_argument("--batch-latency", type=float, default=0.5, help="seconds a batch stays in progress")
    parser.add_argument("--batch-finalize-seconds", type=float, default=0.0, help="then finalizing this long")
    parser.add_argument("--batch-create-stall", type=float, default=0.0, help="create answers this late")
    parser.add_argument("--batch-results-stall", type=float, default=0.0, help="downloads pause half-way")
    parser.add_argument("--batch-expire-rate", type=float, default=0.0, help="share of batches that expire")
    parser.add_argument("--batch-fail-rate", type=float, default=0.0, help="share failing validation")
    parser.add_argument("--batch-line-error-rate", type=float, default=0.0, help="share of lines answering 500")
    parser.add_argument(
        "--batch-cancel-ended-refused", action="store_true", help="a cancel of an ended batch answers 400"
    )
    args = parser.parse_args(argv)
    try:
        faults = parse_fault_rates(args.fault_rate)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    config = MockProviderConfig(
        host=args.host,
        port=args.port,
        latency=args.latency,
        jitter=args.jitter,
        max_concurrency=args.max_concurrency,
        rpm=args.rpm,
        rpm_window=args.rpm_window,
        tpm=args.tpm,
        rpm_model=args.rpm_model,
        proxy_headers=args.proxy_headers,
        fault_rates=faults,
        seed=args.seed,
        batch_latency=args.batch_latency,
        batch_finalize_seconds=args.batch_finalize_seconds,
        batch_create_stall=args.batch_create_stall,
        batch_results_stall=args.batch_results_stall,
        batch_expire_rate=args.batch_expire_rate,
        batch_fail_rate=args.batch_fail_rate,
        batch_line_error_rate=args.batch_line_error_rate,
        batch_cancel_ended_refused=args.batch_cancel_ended_refused,
    )
    return serve_until_stopped(config)


def serve_until_stopped(config: MockProviderConfig) -> int:
    """Serve until SIGTERM or SIGINT, after one line on stdout naming the URL (its port when 0 was
    asked). Returns the exit status: 2 when the address cannot be listened on."""
    checks.freeze_when_built()  # this process is the mock's own
    server = MockProviderServer(config)

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            port = await tg.start(server.serve)
            print(f"mock provider listening on http://{config.host}:{port}", flush=True)
            with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                async for _ in signals:
                    tg.cancel_scope.cancel()
                    return

    try:
        anyio.run(run)
    except OSError as exc:
        print(f"error: cannot listen on {config.host}:{config.port}: {exc.strerror}", file=sys.stderr)
        return 2
    return 0
