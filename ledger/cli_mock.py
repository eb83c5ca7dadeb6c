"""`ledger mock-provider`: the keyless mock provider, as a command like the others (its options
and help in the same style). `python -m adapters.mock_provider` serves the same mock with the
same flags, for processes that do not import the ledger."""

from __future__ import annotations

from typing import Annotated

import typer

from ledger.console import fail


def register_mock_command(app: typer.Typer) -> None:
    app.command("mock-provider")(mock_provider)


def mock_provider(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: a free one, named on the first line).")] = 8089,
    latency: Annotated[float, typer.Option(min=0, help="Seconds each call takes.")] = 0.0,
    jitter: Annotated[float, typer.Option(min=0, help="Up to this many seconds more per call, at random.")] = 0.0,
    max_concurrency: Annotated[
        int | None, typer.Option(min=1, help="Calls served at once; more are answered 429 with retry-after.")
    ] = None,
    rpm: Annotated[int | None, typer.Option(min=1, help="Requests per window; answers say what is left.")] = None,
    tpm: Annotated[
        int | None, typer.Option(min=1, help="Tokens answered per window; answers say what is left.")
    ] = None,
    rpm_window: Annotated[float, typer.Option(min=0, help="Seconds the --rpm and --tpm caps count over.")] = 60.0,
    rpm_model: Annotated[str | None, typer.Option(help="The --rpm cap limits this model's calls only.")] = None,
    proxy_headers: Annotated[
        bool,
        typer.Option(
            "--proxy-headers", help="Rate-limit headers as a LiteLLM proxy's: no reset, 429s without retry-after."
        ),
    ] = False,
    fault_rate: Annotated[
        list[str] | None,
        typer.Option(
            metavar="KIND=RATE",
            help="Share of calls (0-1) failing with KIND: 429, 408, 500, 502, 503, 529, hang or malformed. Repeatable.",
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the random faults and jitter (the same run twice).")] = 0,
    batch_latency: Annotated[float, typer.Option(min=0, help="Seconds a batch stays in progress.")] = 0.5,
    batch_finalize_seconds: Annotated[float, typer.Option(min=0, help="Then finalizing this long.")] = 0.0,
    batch_create_stall: Annotated[float, typer.Option(min=0, help="Seconds a batch create waits to answer.")] = 0.0,
    batch_results_stall: Annotated[float, typer.Option(min=0, help="Seconds downloads pause half-way.")] = 0.0,
    batch_expire_rate: Annotated[float, typer.Option(min=0, max=1, help="Share of batches that expire.")] = 0.0,
    batch_fail_rate: Annotated[float, typer.Option(min=0, max=1, help="Share of batches failing validation.")] = 0.0,
    batch_line_error_rate: Annotated[
        float, typer.Option(min=0, max=1, help="Share of batch result lines answering 500.")
    ] = 0.0,
    batch_cancel_ended_refused: Annotated[
        bool, typer.Option("--batch-cancel-ended-refused", help="A cancel of an ended batch answers 400.")
    ] = False,
) -> None:
    """Serve a mock OpenAI, Anthropic and Gemini provider over HTTP (chat, messages, files, batches) for
    keyless runs: latency, caps and faults as asked. Its first line on stdout names its URL; it stops
    on Ctrl-C or SIGTERM."""
    from adapters.mock_provider import MockProviderConfig, parse_fault_rates
    from adapters.mock_provider.command import serve_until_stopped

    try:
        faults = parse_fault_rates(fault_rate or [])
    except ValueError as exc:
        fail(str(exc))
    config = MockProviderConfig(
        host=host,
        port=port,
        latency=latency,
        jitter=jitter,
        max_concurrency=max_concurrency,
        rpm=rpm,
        rpm_window=rpm_window,
        rpm_model=rpm_model,
        proxy_headers=proxy_headers,
        tpm=tpm,
        fault_rates=faults,
        seed=seed,
        batch_latency=batch_latency,
        batch_finalize_seconds=batch_finalize_seconds,
        batch_create_stall=batch_create_stall,
        batch_results_stall=batch_results_stall,
        batch_expire_rate=batch_expire_rate,
        batch_fail_rate=batch_fail_rate,
        batch_line_error_rate=batch_line_error_rate,
        batch_cancel_ended_refused=batch_cancel_ended_refused,
    )
    raise typer.Exit(serve_until_stopped(config))
