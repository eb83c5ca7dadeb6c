"""Evaluation job specs: the example loads, the JSON form round-trips, and every problem is one exact line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ledger.spec import AgentSpec, JobSpec, SpecError, load_spec, spec_from_mapping

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "eval" / "spec.toml"


def agent(name: str = "judge", **keys: str | None) -> str:
    """An `[[agents]]` body; a key given as None is left out, any other is a TOML literal."""
    fields: dict[str, str | None] = {
        "name": json.dumps(name),
        "provider": '"openai"',
        "model": '"gpt-4o-mini"',
        "system": '"Judge it."',
        **keys,
    }
    return "[[agents]]\n" + "".join(f"{key} = {value}\n" for key, value in fields.items() if value is not None)


def dimension(id: str = "clarity", **keys: str | None) -> str:
    fields: dict[str, str | None] = {"id": json.dumps(id), "name": '"Clarity"', "instruction": '"Is it clear?"', **keys}
    return "[[dimensions]]\n" + "".join(f"{key} = {value}\n" for key, value in fields.items() if value is not None)


def toml(
    top: str = "",
    artifact: str | None = 'text = "def f(): pass"',
    agents: tuple[str, ...] = (agent(),),
    dimensions: tuple[str, ...] = (dimension(),),
) -> str:
    parts = [top, "" if artifact is None else f"[artifact]\n{artifact}\n", *agents, *dimensions]
    return "\n".join(parts)


def with_params(params: str) -> str:
    return toml(agents=(agent(params=params),))


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Work in tmp_path so error lines start with the short relative name `spec.toml`."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.md").write_bytes(b"caf\xe9\n")
    (tmp_path / "empty.md").write_text("\n")
    (tmp_path / "drafts").mkdir()
    return tmp_path


def test_the_example_loads() -> None:
    spec = load_spec(EXAMPLE)
    assert spec.id == "example-eval" and spec.delivery == "online"
    assert [a.name for a in spec.agents] == ["prosecutor", "defense", "tech lead"]
    assert all(a.params == {"temperature": 0, "max_tokens": 400} for a in spec.agents)
    assert len({a.system for a in spec.agents}) == 3
    assert len(spec.dimensions) == 10 and len({d.id for d in spec.dimensions}) == 10
    assert all(d.success and d.failure for d in spec.dimensions)
    assert spec.artifact.strip() and spec.artifact_source == "artifact.md"


def test_defaults_id_from_the_stem_and_inline_artifact(in_tmp: Path) -> None:
    (in_tmp / "nightly.run-2.toml").write_text(toml())
    spec = load_spec("nightly.run-2.toml")
    assert (spec.id, spec.delivery, spec.budget_usd) == ("nightly.run-2", "online", None)
    assert (spec.artifact, spec.artifact_source) == ("def f(): pass", "inline")
    assert spec.agents == (AgentSpec("judge", "openai", "gpt-4o-mini", "Judge it.", {}),)
    assert spec.dimensions[0].success is None and spec.dimensions[0].failure is None


def test_artifact_path_is_relative_to_the_spec_or_absolute(in_tmp: Path) -> None:
    (in_tmp / "sub").mkdir()
    (in_tmp / "sub" / "a.md").write_text("\ufeffrelative\n")
    (in_tmp / "sub" / "spec.toml").write_text(toml(artifact='path = "a.md"'))
    assert load_spec(in_tmp / "sub" / "spec.toml").artifact == "relative\n"  # BOM dropped
    absolute = json.dumps(str(in_tmp / "sub" / "a.md"))
    (in_tmp / "spec.toml").write_text(toml(artifact=f"path = {absolute}"))
    assert load_spec("spec.toml").artifact_source == str(in_tmp / "sub" / "a.md")


def test_json_round_trip_needs_no_files() -> None:
    spec = load_spec(EXAMPLE)
    stored = json.loads(json.dumps(spec.to_json()))
    assert JobSpec.from_json(stored) == spec
    batch = spec_from_mapping(
        {
            "delivery": "batch",
            "budget_usd": 2,
            "artifact": {"text": "x"},
            "agents": [{"name": "a", "provider": "mock", "model": "m", "system": "s", "params": {"seed": 7}}],
            "dimensions": [{"id": "d", "name": "D", "instruction": "i", "success": "s", "failure": "f"}],
        },
        source="trigger",
        base_dir=Path("."),
        default_id="py-job",
    )
    assert (batch.id, batch.delivery, batch.budget_usd) == ("py-job", "batch", 2.0)
    assert JobSpec.from_json(json.loads(json.dumps(batch.to_json()))) == batch


AGENTS_PROVIDERS = "anthropic, azure, gemini, mock, openai, openai-compatible"
CHARSET = "1-200 letters, digits or . _ : -"
ERRORS: list[tuple[str, str, str]] = [
    (
        "invalid TOML",
        'id = "x"\nfoo\n',
        "invalid TOML: Expected '=' after a key in a key/value pair (at line 2, column 4)",
    ),
    ("unknown top key", toml('colour = "red"'), "colour: unknown key"),
    ("unknown agent key", toml(agents=(agent(colour='"red"'),)), "agents[0].colour: unknown key"),
    ("unknown artifact key", toml(artifact='text = "x"\nformat = "md"'), "artifact.format: unknown key"),
    ("missing artifact", toml(artifact=None), "missing key 'artifact'"),
    ("missing agent key", toml(agents=(agent("a"), agent("b", model=None))), "agents[1]: missing key 'model'"),
    ("missing dim key", toml(dimensions=(dimension(instruction=None),)), "dimensions[0]: missing key 'instruction'"),
    ("wrong type", toml(agents=(agent(model="4"),)), "agents[0].model: expected a string, got integer"),
    ("wrong type id", toml("id = 7"), "id: expected a string, got integer"),
    (
        "wrong type optional",
        toml(dimensions=(dimension(success="true"),)),
        "dimensions[0].success: expected a string, got boolean",
    ),
    (
        "agents not tables",
        toml('agents = "judges"', agents=()),
        "agents: expected an array of tables ([[agents]]), got string",
    ),
    ("agent not table", toml("agents = [1]", agents=()), "agents[0]: expected a table, got integer"),
    ("artifact not table", toml('artifact = "a.md"', artifact=None), "artifact: expected a table, got string"),
    ("params not table", with_params('"hot"'), "agents[0].params: expected a table, got string"),
    (
        "param array",
        with_params('{ stop = ["x"] }'),
        "agents[0].params.stop: expected a string, a finite number or a boolean, got array",
    ),
    (
        "param date",
        with_params("{ when = 1979-05-27 }"),
        "agents[0].params.when: expected a string, a finite number or a boolean, got date",
    ),
    (
        "param nan",
        with_params("{ top_p = nan }"),
        "agents[0].params.top_p: expected a string, a finite number or a boolean, got nan",
    ),
    ("empty name", toml(agents=(agent(""),)), "agents[0].name: must not be empty"),
    ("blank system", toml(agents=(agent(system='"  "'),)), "agents[0].system: must not be empty"),
    ("empty dim name", toml(dimensions=(dimension(name='""'),)), "dimensions[0].name: must not be empty"),
    ("empty artifact text", toml(artifact='text = ""'), "artifact.text: must not be empty"),
    ("newline in name", toml(agents=(agent("a\nb"),)), "agents[0].name: must not contain a newline"),
    ("newline in dim id", toml(dimensions=(dimension("a\nb"),)), "dimensions[0].id: must not contain a newline"),
    (
        "duplicate agent",
        toml(agents=(agent("p"), agent("defense"), agent("defense"))),
        "agents[2].name: duplicate name 'defense' (first at agents[1])",
    ),
    (
        "duplicate dimension",
        toml(dimensions=tuple(dimension(i) for i in ("clarity", "security", "performance", "clarity"))),
        "dimensions[3].id: duplicate id 'clarity' (first at dimensions[0])",
    ),
    (
        "unknown provider",
        toml(agents=(agent(provider='"gemni"'),)),
        f"agents[0].provider: unknown provider 'gemni' (known: {AGENTS_PROVIDERS})",
    ),
    ("invalid delivery", toml('delivery = "fast"'), "delivery: must be 'online', 'batch' or 'auto', got 'fast'"),
    ("negative budget", toml("budget_usd = -1"), "budget_usd: must be a number >= 0, got -1"),
    ("infinite budget", toml("budget_usd = inf"), "budget_usd: must be a number >= 0, got inf"),
    ("budget as string", toml('budget_usd = "5"'), "budget_usd: must be a number >= 0, got '5'"),
    ("cache as string", toml('cache = "no"'), "cache: must be true or false, got 'no'"),
    ("zero samples", toml("samples = 0"), "samples: must be an integer from 1 to 100, got 0"),
    ("fractional samples", toml("samples = 2.5"), "samples: must be an integer from 1 to 100, got 2.5"),
    ("zero agents", toml(agents=()), "agents: at least one [[agents]] table is required"),
    ("empty agents", toml("agents = []", agents=()), "agents: at least one [[agents]] table is required"),
    ("zero dimensions", toml(dimensions=()), "dimensions: at least one [[dimensions]] table is required"),
    (
        "artifact both",
        toml(artifact='path = "a.md"\ntext = "x"'),
        "artifact: needs exactly one of 'path' or 'text', got both",
    ),
    ("artifact neither", toml(artifact=""), "artifact: needs exactly one of 'path' or 'text', got neither"),
    (
        "artifact missing",
        toml(artifact='path = "missing.md"'),
        "artifact.path: cannot read 'missing.md' (no such file)",
    ),
    ("artifact dir", toml(artifact='path = "drafts"'), "artifact.path: cannot read 'drafts' (is a directory)"),
    (
        "artifact not utf8",
        toml(artifact='path = "bad.md"'),
        "artifact.path: cannot read 'bad.md' (not UTF-8: invalid byte at offset 3)",
    ),
    ("artifact empty", toml(artifact='path = "empty.md"'), "artifact.path: 'empty.md' is empty"),
    (
        "max_tokens zero",
        with_params("{ max_tokens = 0 }"),
        "agents[0].params.max_tokens: must be an integer in 1..1000000, got 0",
    ),
    (
        "max_tokens bool",
        with_params("{ max_tokens = true }"),
        "agents[0].params.max_tokens: must be an integer in 1..1000000, got true",
    ),
    (
        "max_tokens float",
        with_params("{ max_tokens = 1.5 }"),
        "agents[0].params.max_tokens: must be an integer in 1..1000000, got 1.5",
    ),
    (
        "temperature high",
        with_params("{ temperature = 3 }"),
        "agents[0].params.temperature: must be a number in 0..2, got 3",
    ),
    (
        "max_tokens absurd",
        with_params("{ max_tokens = 10_000_000 }"),
        "agents[0].params.max_tokens: must be an integer in 1..1000000, got 10000000",
    ),
    (
        "top_p high",
        with_params("{ top_p = 1.5 }"),
        "agents[0].params.top_p: must be a number in 0..1, got 1.5",
    ),
    (
        "n above one",
        with_params("{ n = 3 }"),
        "agents[0].params.n: only 1 is supported (one answer per request; enqueue n requests instead), got 3",
    ),
    (
        "temperature text",
        with_params('{ temperature = "hot" }'),
        "agents[0].params.temperature: must be a number in 0..2, got 'hot'",
    ),
    ("bad id", toml('id = "my job"'), f"id: must be {CHARSET}, got 'my job'"),
    ("long id", toml(f'id = "{"x" * 201}"'), f"id: must be {CHARSET}, got '{'x' * 201}'"),
    ("empty id", toml('id = ""'), "id: must not be empty"),
]


@pytest.mark.parametrize(("text", "message"), [case[1:] for case in ERRORS], ids=[case[0] for case in ERRORS])
def test_each_problem_is_one_exact_line(in_tmp: Path, text: str, message: str) -> None:
    (in_tmp / "spec.toml").write_text(text)
    with pytest.raises(SpecError) as caught:
        load_spec("spec.toml")
    assert str(caught.value) == f"spec.toml: {message}"
    assert "\n" not in str(caught.value) and caught.value.__cause__ is None


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("absent.toml", None, "absent.toml: cannot read spec file (no such file)"),
        (
            "latin1.toml",
            b'id = "caf\xe9"\n',
            "latin1.toml: cannot read spec file (not UTF-8: invalid byte at offset 9)",
        ),
        ("my spec.toml", toml().encode(), f"my spec.toml: id: not set, and the default 'my spec' is not {CHARSET}"),
    ],
)
def test_spec_file_problems(in_tmp: Path, name: str, content: bytes | None, message: str) -> None:
    if content is not None:
        (in_tmp / name).write_bytes(content)
    with pytest.raises(SpecError) as caught:
        load_spec(name)
    assert str(caught.value) == message and "\n" not in message


def test_mapping_errors_start_with_the_given_source() -> None:
    with pytest.raises(SpecError, match=r"^Ledger\.trigger: missing key 'artifact'$"):
        spec_from_mapping({}, source="Ledger.trigger", base_dir=Path("."), default_id="job")
    assert issubclass(SpecError, ValueError)


def test_cache_and_samples_reach_every_request_of_the_job(in_tmp: Path) -> None:
    from ledger.evaluation import requests_for

    (in_tmp / "spec.toml").write_text(toml("cache = false\nsamples = 3"))
    spec = load_spec("spec.toml")
    assert (spec.cache, spec.samples) == (False, 3)
    assert JobSpec.from_json(spec.to_json()) == spec  # kept with the job, resumed as it was
    made = requests_for(spec, frozenset())
    assert sorted(r.sample for r in made) == [0, 1, 2] and not any(r.cache for r in made)
    keys = [r.idempotency_key for r in made]
    assert keys == ["spec:judge:clarity", "spec:judge:clarity#s1", "spec:judge:clarity#s2"]  # sample 0: the usual key
