"""`bounded`: the engine's limit on one env call. Its own deadline names the call; a
TimeoutError the call raises itself keeps its message (web-crm-v1's frozen browser)."""

from __future__ import annotations

import asyncio

import pytest

from rldojo.rollout.episodes import bounded


async def _raises_its_own() -> None:
    raise TimeoutError("web-crm-v1: the browser did not answer")


async def _never_ends() -> None:
    await asyncio.Event().wait()


async def _returns() -> str:
    return "page"


def test_the_calls_own_timeout_keeps_its_message():
    with pytest.raises(TimeoutError, match=r"^web-crm-v1: the browser did not answer$"):
        asyncio.run(bounded(_raises_its_own(), 60, "env.step"))


def test_past_the_deadline_the_call_is_named():
    with pytest.raises(TimeoutError, match=r"^env\.reset took longer than 0\.05s$"):
        asyncio.run(bounded(_never_ends(), 0.05, "env.reset"))


def test_a_call_in_time_returns_its_value():
    assert asyncio.run(bounded(_returns(), 60, "env.step")) == "page"
