"""The keyless mock provider: a program of its own (an HTTP server), not a provider adapter.

`server` answers the online routes, `batches` the Files / Batch / Message Batches
routes, `wire` holds both wire formats, `answers` the deterministic answers (shared
with the in-process `adapters.mock.MockAdapter`), `running` starts it in a thread
or a child process.
"""

from adapters.mock_provider.command import main
from adapters.mock_provider.config import MockProviderConfig, parse_fault_rates
from adapters.mock_provider.running import (
    MockProviderProcess,
    RunningMockProvider,
    mock_provider_process,
    running_mock_provider,
)
from adapters.mock_provider.server import MockProviderServer

__all__ = [
    "MockProviderConfig",
    "MockProviderProcess",
    "MockProviderServer",
    "RunningMockProvider",
    "main",
    "mock_provider_process",
    "parse_fault_rates",
    "running_mock_provider",
]
