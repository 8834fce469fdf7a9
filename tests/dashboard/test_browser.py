"""The dashboard in a real headless browser (Debian's chromium through Playwright): the
runs list, a run page with charts drawn from data points, the rollout viewer with the
forking tokens of a known ledger row outlined, a status filter, a group, a report and bad
input, with every request checked to stay on this machine. Screenshots go to
`build/dashboard-screenshots/` (or `$RLDOJO_SCREENSHOTS`)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
from dashboard.runs_fixture import KNOWN_SELECTED, KNOWN_TEXT

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.slow,  # a headless browser against a dashboard server
    pytest.mark.skipif(
        CHROMIUM is None, reason="Debian's chromium is not installed (make test installs it)"
    ),
]
REPO = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("RLDOJO_SCREENSHOTS", REPO / "build" / "dashboard-screenshots"))
WAIT_MS = 30_000
"""Bound on every wait for a page condition."""


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser, served):
    """A page that records every request; the test ends by checking none left loopback."""
    handle, _, _ = served
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    pg.set_default_timeout(WAIT_MS)
    seen: list[str] = []
    pg.on("request", lambda r: seen.append(r.url))
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    context.close()
    assert seen, "the page made no request at all"
    hosts = {urlparse(u).hostname for u in seen if not u.startswith(("data:", "blob:"))}
    assert hosts == {handle.host}, f"requests left the machine: {sorted(hosts)}"
    assert errors == [], errors


def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def test_runs_list_then_a_run_with_charts(page, served):
    handle, _, _ = served
    page.goto(handle.url)
    page.wait_for_selector("#runs tr[data-run='alpha']")
    rows = page.locator("#runs tbody tr")
    shown = set(rows.evaluate_all("rs => rs.map(r => r.dataset.run)"))
    assert {"alpha", "beta", "gamma"} <= shown  # (and the runs other tests add)
    assert "finished" in page.inner_text("tr[data-run='alpha']")
    assert "50.0%" in page.inner_text("tr[data-run='alpha']")  # held-out after
    page.fill("#filter", "finished")
    page.wait_for_function("document.querySelectorAll('#runs tbody tr').length === 1")
    assert page.get_attribute("#runs tbody tr", "data-run") == "alpha"
    page.fill("#filter", "")
    shot(page, "runs")
    page.click("tr[data-run='alpha'] a")
    page.wait_for_selector(".chart[data-title='Reward'] .scatterlayer .trace")
    points = page.locator(".chart[data-title='Reward'] .scatterlayer .trace .points path")
    assert points.count() == 2 * 4  # reward/mean and reward/std, 4 steps each
    heldout = page.locator(".chart[data-title='Held-out accuracy (95% CI)'] .errorbar")
    assert heldout.count() == 2  # before and after, with their intervals
    assert "step 4" in page.inner_text("#checkpoints")
    shot(page, "run")


def test_compare_overlays_runs(page, served):
    handle, _, _ = served
    page.goto(f"{handle.url}run?id=alpha&id=beta")
    page.wait_for_selector(".chart[data-title='Reward'] .scatterlayer .trace")
    names = page.locator(".chart[data-title='Reward'] .legendtext").evaluate_all(
        "ts => ts.map(t => t.textContent)"
    )
    assert {"alpha · reward/mean", "beta · reward/mean"} <= set(names)


def test_rollout_viewer_outlines_the_forking_tokens(page, served, tiny):
    handle, ids, _ = served
    _, tokenizer = tiny
    page.goto(f"{handle.url}rollouts?run=alpha")
    page.wait_for_selector("#rollouts tr.row")
    assert page.inner_text("#count") == "1–6 of 6"
    page.select_option("select[name=status]", "timeout")
    page.click("#filters button[type=submit]")
    page.wait_for_function("document.querySelectorAll('#rollouts tr.row').length === 1")
    assert page.get_attribute("#rollouts tr.row", "data-id") == str(ids["failed"])
    page.select_option("select[name=status]", "")
    page.fill("input[name=text]", "so Answer")
    page.click("#filters button[type=submit]")
    page.wait_for_function(
        "[...document.querySelectorAll('#rollouts tr.row')].map(r => r.dataset.id).join()"
        f" === '{ids['known']}'"
    )
    shot(page, "rollouts")
    page.click(f"#rollouts tr[data-id='{ids['known']}'] td:first-child")
    page.wait_for_selector(".msg.policy .tok")
    outlined = page.locator("#conv .tok.sel").evaluate_all(
        "ts => ts.map(t => [+t.dataset.i, t.textContent])"
    )
    expected = tokenizer.encode(KNOWN_TEXT, add_special_tokens=False)
    assert outlined == [[i, tokenizer.decode([expected[i]])] for i in KNOWN_SELECTED]
    page.hover(f".tok[data-i='{KNOWN_SELECTED[0]}']")
    page.wait_for_selector("#tip", state="visible")
    assert "selected" in page.inner_text("#tip") and "entropy" in page.inner_text("#tip")
    assert "0.870" in page.inner_text("#meta")  # the advantage
    shot(page, "rollout")


def test_tool_turns_are_distinct(page, served):
    handle, ids, _ = served
    page.goto(f"{handle.url}rollout?run=alpha&id={ids['tool']}")
    page.wait_for_selector(".msg.tool")
    roles = page.locator(".msg .role").all_inner_texts()
    assert [r.lower() for r in roles] == ["user", "assistant", "tool", "assistant"]
    assert "<tool_response>5</tool_response>" in page.inner_text(".msg.tool")
    assert page.locator(".msg.policy .toolcall").count() == 1


def test_group_and_report_pages(page, served):
    handle, _, _ = served
    page.goto(f"{handle.url}group?run=alpha&step=1&task=arith-v1/train/0/7")
    page.wait_for_selector(".card[data-sample]")
    rewards = page.locator("[data-reward]").all_inner_texts()
    assert rewards == ["1", "-0.500", "-0.500", "1"]
    page.goto(f"{handle.url}reports")
    page.click("tr[data-report='0/evals/report.md']")
    page.wait_for_selector("#report table")
    assert "McNemar p = 0.031" in page.inner_text("#report")


def test_bad_input_shows_a_message_not_a_traceback(page, served):
    handle, _, _ = served
    for path in ("run?id=../../etc", "rollouts?run=gamma", "rollout?run=alpha&id=424242"):
        page.goto(handle.url + path)
        page.wait_for_selector("[data-error]")
        text = page.inner_text("body")
        assert "Traceback" not in text and ("no run" in text or "no ledger" in text
                                           or "no rollout" in text), text  # fmt: skip


def test_run_page_updates_live_while_the_run_writes(page, served):
    from dashboard.runs_fixture import write_metrics

    handle, _, root = served
    run = root / "live"
    run.mkdir(exist_ok=True)
    metrics = run / "metrics.jsonl"
    write_metrics(metrics, 2, truncated=True)
    later = time.time() + 86_400
    os.utime(metrics, (later, later))  # "running", so the page keeps polling
    page.goto(f"{handle.url}run?id=live")
    reward = ".chart[data-title='Reward'] .scatterlayer .trace:first-child .points path"
    page.wait_for_selector(reward)
    assert page.locator(reward).count() == 2  # steps 1 and 2 (the cut-off line is skipped)
    text = metrics.read_text()
    whole = text[: text.rindex("\n") + 1]  # the run finishes writing its line, then a step
    metrics.write_text(whole + json.dumps({"step": 3, "kind": "train", "reward/mean": 0.9,
                                           "reward/std": 0.1}) + "\n")  # fmt: skip
    os.utime(metrics, (later, later))
    page.wait_for_function(f'document.querySelectorAll("{reward}").length === 3')
