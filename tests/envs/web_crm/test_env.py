"""web-crm-v1 end to end: the env over the real app, server and headless Chromium.

The expert plays one task of every template through the browser and reaches reward 1;
an agent's mistakes (a malformed call, an unknown ref, a navigation out of the app, an
unknown tool) are tool errors the episode survives; a killed browser is the rollout's
`env_error`, a frozen one its `timeout`, and the next episode runs on a new browser.
(`check_env` runs on it with every built-in env, in tests/envs/test_check_env.py; no
Playwright or no Chromium is one line, in test_chromium.py.)
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal

import pytest

from rldojo.envs.registry import make_env
from rldojo.envs.web_crm.env import shared_pool
from rldojo.envs.web_crm.expert import SCRIPTS, make_expert
from rldojo.envs.web_crm.tasks import WEB_TEMPLATES
from rldojo.rollout.demos import play_episode

pytestmark = [
    pytest.mark.slow,  # a headless browser against the app's server
    pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium (make test)"),
]


def _one_task_per_template():
    tasks = {}
    for level in WEB_TEMPLATES:
        for task in make_env("web-crm-v1", levels=[level], db_size="small").tasks("train", n=40):
            tasks.setdefault(task.info["template"], task)
    return tasks


def _call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_the_expert_reaches_reward_1_on_every_template():
    tasks = _one_task_per_template()
    assert set(tasks) == set(SCRIPTS)  # every template drawn, every one has a script
    expert = make_expert()

    async def play(task):
        env = make_env("web-crm-v1", levels=[task.info["level"]], db_size="small")
        try:
            return await play_episode(env, expert.act, task, seed=0, timeout_s=60)
        finally:
            await env.close()

    async def play_all():
        return await asyncio.gather(*(play(t) for t in tasks.values()))

    episodes = asyncio.run(play_all())
    for name, ep in zip(tasks, episodes, strict=True):
        assert ep.rollout.status == "ok", (name, ep.rollout.error)
        assert ep.score.value == 1.0, (name, ep.score.explanation)
        assert ep.rollout.info["web/refusals"] == 0
    calls = {n: e.rollout.info["tool/calls"] for n, e in zip(tasks, episodes, strict=True)}
    assert max(calls[n] for n in ("contact_email", "deal_stage", "account_owner")) <= 4, calls
    assert calls["win_and_thank"] >= 12 and calls["deal_and_note_in_words"] >= 12, calls


def test_mistakes_are_tool_errors_the_episode_survives():
    env = make_env("web-crm-v1", levels=[1], db_size="small")
    task = env.tasks("train", n=1)[0]

    async def run():
        await env.reset(task, seed=0)
        replies = []
        for action in (
            "<tool_call>{not json</tool_call>",
            _call("click", ref=999),
            _call("goto", path="http://example.invalid/"),
            _call("goto", path="file:///etc/passwd"),
            _call("submit_form", ref=1),
            _call("click", ref=2),  # the nav link "Accounts": the episode goes on
        ):
            result = await env.step(action)
            assert not result.done
            replies.append(result.messages[0]["content"])
        await env.close()
        return replies, result.info

    replies, info = asyncio.run(run())
    assert "malformed" in replies[0]
    assert "unknown ref 999" in replies[1] and "Page: /" in replies[1]
    assert "refused: outside the application" in replies[2]
    assert "refused" in replies[3]
    assert "unknown tool 'submit_form'" in replies[4]
    assert "Page: /accounts" in replies[5]
    assert info["tool/malformed"] == 1 and info["tool/tool_error"] == 3
    assert info["tool/unknown_tool"] == 1 and info["tool/calls"] == 1
    assert info["web/refused"].get("host") == 1 and info["web/refusals"] == 2


def _signal_the_browser_then_play_again(sig: int, pool, signalled: list[int]):
    """One episode whose browser gets `sig` while the policy thinks about its first turn,
    then one on a fresh env; the pid signalled goes into `signalled`."""
    env = make_env("web-crm-v1", levels=[1], db_size="small")
    task = env.tasks("train", n=1)[0]
    expert = make_expert()

    def signal_then_act(messages, task):
        if not signalled:
            signalled.append(pool().browser_pid)
            os.kill(signalled[0], sig)
        return expert.act(messages, task)

    async def run():
        first = await play_episode(env, signal_then_act, task, seed=0, timeout_s=60)
        await env.close()
        fresh = make_env("web-crm-v1", levels=[1], db_size="small")
        second = await play_episode(fresh, expert.act, task, seed=0, timeout_s=60)
        await fresh.close()
        return first, second

    return asyncio.run(run())


def test_a_killed_browser_is_env_error_and_the_next_episode_runs():
    killed: list[int] = []
    first, second = _signal_the_browser_then_play_again(signal.SIGKILL, shared_pool, killed)
    assert first.rollout.status == "env_error", first.rollout.status
    assert "BrowserCrashed" in first.rollout.error
    assert second.rollout.status == "ok" and second.score.value == 1.0
    assert shared_pool().browser_pid not in (None, killed[0])


def test_a_hung_browser_is_timeout_and_the_next_episode_runs(monkeypatch):
    from rldojo.envs.web_crm import env as env_module
    from rldojo.envs.web_crm.browser import BrowserPool

    pool = BrowserPool(max_contexts=2, action_timeout_s=2)  # the shared pool waits 15 s
    monkeypatch.setattr(env_module, "_POOL", pool)
    frozen: list[int] = []
    try:
        first, second = _signal_the_browser_then_play_again(signal.SIGSTOP, lambda: pool, frozen)
    finally:
        pool.close()
        for pid in frozen:  # the pool kills a frozen browser; this is in case it did not
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert first.rollout.status == "timeout", (first.rollout.status, first.rollout.error)
    assert "the browser did not answer" in first.rollout.error
    assert first.score is None or first.score.status != "ok"
    assert second.rollout.status == "ok" and second.score.value == 1.0
    assert pool.browser_pid != frozen[0]
