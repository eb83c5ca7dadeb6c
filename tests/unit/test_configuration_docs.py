"""Every setting is documented once in each place a user looks: `.env.example` (one line per
variable, with its default) and docs/configuration.md (one table row per variable), and
neither names a variable the ledger does not read."""

from __future__ import annotations

import re
from pathlib import Path

from ledger.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def settings_names() -> set[str]:
    return {str(field.alias) for field in Settings.model_fields.values()}


def test_env_example_lists_exactly_the_settings() -> None:
    text = (ROOT / ".env.example").read_text()
    names = re.findall(r"^([A-Z][A-Z0-9_]*)=", text, flags=re.MULTILINE)
    assert len(names) == len(set(names)), "a variable is listed twice in .env.example"
    assert set(names) == settings_names()


def test_configuration_page_lists_exactly_the_settings() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    names = re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \|", text, flags=re.MULTILINE)
    assert len(names) == len(set(names)), "a variable has two rows in docs/configuration.md"
    assert set(names) == settings_names()
