"""`python -m adapters.mock_provider`: serve the mock provider (same flags as `ledger mock-provider`)."""

from adapters.mock_provider.command import main

raise SystemExit(main())
