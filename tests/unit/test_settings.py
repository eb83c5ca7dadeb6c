"""Settings: the defaults, the 1-50 bound and its exact error message."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.settings import DEFAULT_DATABASE_URL, SettingsError, load_settings


def test_defaults_match_the_seed() -> None:
    s = load_settings(_env_file=None)
    assert (s.max_concurrent_llm_calls, s.retry_initial_delay, s.retry_max_delay) == (5, 1.0, 60.0)
    assert (s.retry_max_attempts, s.batching_enabled, s.llm_call_timeout) == (3, False, 120.0)
    assert s.database_url == DEFAULT_DATABASE_URL == "sqlite:///ledger.db"


@pytest.mark.parametrize("value", ["0", "-3"])
def test_zero_or_negative_limit_raises_the_seed_message(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("MAX_CONCURRENT_LLM_CALLS", value)
    with pytest.raises(ValueError) as caught:
        load_settings(_env_file=None)
    assert str(caught.value) == f"MAX_CONCURRENT_LLM_CALLS must be >= 1, got {value}"


def test_limit_above_fifty_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAX_CONCURRENT_LLM_CALLS", "51")
    with pytest.raises(SettingsError, match="MAX_CONCURRENT_LLM_CALLS must be <= 50, got 51"):
        load_settings(_env_file=None)


@pytest.mark.parametrize("value", ["1", "50"])
def test_limit_bounds_are_inclusive(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("MAX_CONCURRENT_LLM_CALLS", value)
    assert load_settings(_env_file=None).max_concurrent_llm_calls == int(value)


def test_dotenv_file_is_read(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("MAX_CONCURRENT_LLM_CALLS=7\nRETRY_MAX_ATTEMPTS=5\nBATCHING_ENABLED=true\n")
    s = load_settings()
    assert (s.max_concurrent_llm_calls, s.retry_max_attempts, s.batching_enabled) == (7, 5, True)


def test_bad_value_names_the_variable_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_CALL_TIMEOUT", "soon")
    with pytest.raises(SettingsError) as caught:
        load_settings(_env_file=None)
    message = str(caught.value)
    assert message.startswith("LLM_CALL_TIMEOUT:") and "soon" in message and "\n" not in message


def test_pool_limits_are_parsed_normalised_and_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGER_POOL_LIMITS", "openai:gpt-4o-mini=4, http://box:8080/v1=2,big=99")
    s = load_settings(_env_file=None)
    assert s.pool_limits == {"openai:gpt-4o-mini": 4, "http:box:8080": 2, "id:big": 99}
    assert s.pool_limit("openai:gpt-4o-mini") == 4
    assert s.pool_limit("id:big") == 5  # never above the global limit
    assert s.pool_limit("anthropic:other") == 5


def test_bad_pool_limit_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEDGER_POOL_LIMITS", "openai:gpt-4o=lots")
    with pytest.raises(SettingsError, match="LEDGER_POOL_LIMITS item 'openai:gpt-4o=lots'"):
        load_settings(_env_file=None)


def test_env_example_documents_every_setting_and_loads_as_the_defaults(tmp_path: Path) -> None:
    from ledger.settings import Settings

    example = (Path(__file__).parents[2] / ".env.example").read_text()
    missing = [f.alias for f in Settings.model_fields.values() if f.alias and f"\n{f.alias}=" not in example]
    assert missing == []
    (tmp_path / ".env").write_text(example)
    assert load_settings() == load_settings(_env_file=None)


def test_a_dotenv_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_bytes(b"RETRY_MAX_ATTEMPTS=4\nLEDGER_LOG_LEVEL=INFO # caf\xe9\n")
    with pytest.raises(SettingsError) as caught:
        load_settings(_env_file=env)
    assert str(caught.value) == f"{env}:2: not UTF-8 (byte 0xe9 at column 28)"


def test_a_dotenv_byte_order_mark_is_not_part_of_the_first_name(tmp_path: Path) -> None:
    env = tmp_path / ".env"
    env.write_bytes(b"\xef\xbb\xbfRETRY_MAX_ATTEMPTS=7\n")
    assert load_settings(_env_file=env).retry_max_attempts == 7
