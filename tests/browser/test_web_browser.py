"""The web view in a real headless Chromium against a real `ledger web` process: the example job's
matrix is `ledger report --json`, a cell leads to its request and attempts, the job page follows
a daemon without a reload, hostile output stays text and runs nothing, the token is asked for
off loopback, a `--virtual-time-budget` screenshot of a live page finishes, identifiers wrap only
between words."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ledger.jobs import trigger
from ledger.settings import load_settings
from ledger.spec import load_spec
from ledger.store import Store
from tests.acceptance.procs import ledger_env, mock_provider, start_daemon
from tests.browser.conftest import ARGS
from tests.integration.web_helpers import EXAMPLE, LEDGER, WebLedger, build_ledger, env_for, web_process

NEVER_SET = "() => window.__pwned === undefined"


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> WebLedger:
    """One ledger for the tests that only read it: `build_ledger` in a thread of its own (it runs
    a daemon on an event loop, and Playwright's sync API keeps one running in the test's thread)."""
    path = tmp_path_factory.mktemp("browser") / "ledger.db"
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(build_ledger, f"sqlite:///{path}").result()


def report_scores(url: str, job_id: str) -> dict[tuple[str, str], str]:
    said = subprocess.run(
        [*LEDGER, "report", job_id, "--json"], env=env_for(url), capture_output=True, text=True, timeout=60, check=True
    )
    opinions = [json.loads(line) for line in said.stdout.splitlines() if line.strip()]
    return {(o["agent"], o["dimension"]): "" if o["score"] is None else str(o["score"]) for o in opinions}


def matrix_of(page: Any) -> dict[tuple[str, str], str]:
    read = "cells => cells.map(c => [c.dataset.agent, c.dataset.dimension, c.dataset.score])"
    cells = page.eval_on_selector_all("#score-matrix td[data-agent]", read)
    return {(agent, dimension): score for agent, dimension, score in cells}


def test_the_matrix_is_the_report_and_a_cell_reaches_its_attempts(page: Any, ledger: WebLedger) -> None:
    with web_process(ledger.url) as (_proc, base):
        page.goto(f"{base}/jobs/{ledger.job_id}")
        expected = report_scores(ledger.url, ledger.job_id)
        assert len(expected) == 30 and matrix_of(page) == expected
        page.click('#score-matrix td[data-agent="defense"][data-dimension="correctness"] a')
        page.wait_for_selector("#cell-opinions")
        page.click("#cell-opinions a.request-link")
        page.wait_for_selector("#attempts")
        assert page.locator("#attempts tr[data-attempt]").count() >= 1
        assert page.locator("#verdict-line").count() == 1
        assert page.dialogs == []


@pytest.mark.timing  # progress seen between 0 and done, at the daemon's pace: run alone (see the test command)
def test_the_job_page_follows_a_daemon_without_a_reload(page: Any, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    store = Store(url)
    job_id = trigger(store, load_settings(_env_file=None, LEDGER_DATABASE_URL=url), load_spec(EXAMPLE)).job_id
    with web_process(url) as (_proc, base), mock_provider("--latency", "0.25") as mock:
        page.goto(f"{base}/jobs/{job_id}")
        page.wait_for_selector("#live-state.on")  # the event stream is open
        page.evaluate("() => { window.__same_page = true; }")  # gone if the page reloads
        assert page.get_attribute("#job-progress", "data-done") == "0"
        env = ledger_env(url, mock, MAX_CONCURRENT_LLM_CALLS=2)
        daemon = start_daemon(env, tmp_path / "daemon.log", "--until-idle")
        seen: set[str] = set()
        deadline = time.monotonic() + 90
        while page.text_content("#job-status") != "completed":
            seen.add(page.get_attribute("#job-progress", "data-done") or "")
            assert time.monotonic() < deadline, (seen, (tmp_path / "daemon.log").read_text()[-2000:])
            page.wait_for_timeout(100)
        assert daemon.wait(timeout=60) == 0
        assert page.evaluate("() => window.__same_page === true")  # updated in place, never reloaded
        assert len(seen - {"0", "30"}) >= 1, seen  # progress moved through values in between
        scored = "#score-matrix td[data-score]:not([data-score=''])"
        page.wait_for_function(f"() => document.querySelectorAll({json.dumps(scored)}).length === 30")
        assert matrix_of(page) == report_scores(url, job_id)
    store.close()


def test_hostile_output_renders_as_text_and_runs_nothing(page: Any, ledger: WebLedger) -> None:
    with web_process(ledger.url) as (_proc, base):
        page.goto(f"{base}/requests/{ledger.ids['hostile']}")
        shown = page.text_content("#raw-output") or ""
        assert "<script>window.__pwned = 1" in shown and "<img src=x onerror=" in shown and "javascript:" in shown
        assert page.locator("#raw-output script, #raw-output img, #raw-output a").count() == 0
        assert page.locator("a[href^='javascript:' i]").count() == 0
        page.goto(f"{base}/requests?q=%3Cscript")
        assert page.locator(f"tr[data-request-id='{ledger.ids['hostile']}']").count() == 1
        page.goto(f"{base}/requests/{ledger.ids['hostile']}")
        page.wait_for_load_state("load")
        assert page.evaluate(NEVER_SET) and page.dialogs == []


def test_off_loopback_the_browser_must_sign_in(page: Any, ledger: WebLedger) -> None:
    with web_process(ledger.url, "--host", "0.0.0.0", LEDGER_WEB_TOKEN="browser-t0ken") as (_proc, base):
        response = page.goto(f"{base}/jobs/{ledger.job_id}")
        assert response is not None and response.status == 401
        assert page.locator("#score-matrix").count() == 0
        page.fill("input[name=token]", "wrong")
        page.click("#login button")
        page.wait_for_selector("#login-failed")
        page.fill("input[name=token]", "browser-t0ken")
        page.click("#login button")
        page.wait_for_selector("#score-matrix")
        assert page.url.endswith(f"/jobs/{ledger.job_id}")
        page.wait_for_selector("#live-state.on")  # the event stream signs in with the cookie too


def screenshot(chromium_executable: str, url: str, shot: Path, profile: Path) -> subprocess.CompletedProcess[bytes]:
    """`chromium --headless --virtual-time-budget=5000 --screenshot` as a user's tool runs it; its
    whole process group killed if it has not finished in a minute."""
    command = [chromium_executable, "--headless", *ARGS, f"--user-data-dir={profile}"]
    command += ["--virtual-time-budget=5000", f"--screenshot={shot}", "--window-size=1280,900", url]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise AssertionError(f"chromium took a screenshot of {url} for over a minute: the page never settled") from None
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def test_a_headless_screenshot_of_a_live_page_finishes(
    chromium_executable: str, ledger: WebLedger, tmp_path: Path
) -> None:
    """A stream the page holds open stops a headless browser's virtual time: with it, a screenshot
    tool pointed at any live page waited forever. Each page here has a live section."""
    with web_process(ledger.url) as (_proc, base):
        for i, path in enumerate(["/", f"/jobs/{ledger.job_id}", f"/requests/{ledger.ids['limited']}"]):
            shot = tmp_path / f"page-{i}.png"
            done = screenshot(chromium_executable, base + path, shot, tmp_path / "profile")
            assert done.returncode == 0, done.stderr[-2000:]
            assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# Each cell whose rendered text breaks onto a new line between two letters or digits.
MID_WORD_BREAKS = """cells => cells.filter(cell => {
  const chars = [];
  const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    for (let i = 0; i < node.data.length; i++) {
      const range = document.createRange();
      range.setStart(node, i);
      range.setEnd(node, i + 1);
      const box = range.getClientRects()[0];
      if (box) { chars.push([node.data[i], box.top]); }
    }
  }
  const word = /[A-Za-z0-9]/;
  return chars.some((c, i) => i > 0 && c[1] > chars[i - 1][1] + 2 && word.test(c[0]) && word.test(chars[i - 1][0]));
}).map(cell => cell.textContent.trim())"""


def test_identifiers_in_the_request_list_wrap_only_between_words(page: Any, ledger: WebLedger) -> None:
    """custom_ids, jobs and pools in a narrow window: broken at their separators, never mid-word
    (`word-break: break-all` had `example-ev` / `al:tech le` / `ad:operabi` / `lity`)."""
    page.set_viewport_size({"width": 900, "height": 800})
    columns = ", ".join(f"#requests tr[data-request-id] td:nth-child({n})" for n in (2, 3, 4))
    with web_process(ledger.url) as (_proc, base):
        for path in (f"/requests?job={ledger.job_id}", "/requests"):
            page.goto(base + path)
            assert page.locator(columns).count() >= 90  # 30 rows at least
            assert page.eval_on_selector_all(columns, MID_WORD_BREAKS) == [], path
