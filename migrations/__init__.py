"""Alembic migrations, shipped inside the package so `ledger migrate` works after `pip install`."""
