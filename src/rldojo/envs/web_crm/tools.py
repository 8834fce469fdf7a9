"""The browser actions of web-crm-v1 as the tools the model sees.

Each function's signature and docstring are one tool's schema (`Tool.from_function`);
the bodies are empty because the environment sends the calls to the browser itself
(`BrowserSession.act`, which checks the arguments and answers mistakes with an
`ActionError` the model reads) — except ``answer``, which ends the episode.
"""

from __future__ import annotations

from typing import Literal

from rldojo.envs.tools import Tool

__all__ = ["ACTION_TOOLS", "BROWSER_ACTIONS"]


async def click(ref: int) -> None:
    """Click a link or button.

    Args:
        ref: the number in brackets before it on the page.
    """


async def type_text(ref: int, text: str) -> None:
    """Replace the text of a field.

    Args:
        ref: the number of the field.
        text: what to type.
    """


async def select(ref: int, option: str) -> None:
    """Choose an option of a drop-down field.

    Args:
        ref: the number of the field.
        option: the option, as listed.
    """


async def goto(path: str) -> None:
    """Open a page of the application by its path, e.g. /deals?q=renewal.

    Args:
        path: the path, starting with /.
    """


async def back() -> None:
    """Go back to the previous page."""


async def scroll(direction: Literal["up", "down"]) -> None:
    """Show more of a long page.

    Args:
        direction: up or down.
    """


async def answer(text: str) -> None:
    """Reply to the user and end the task (the same as <answer>text</answer>).

    Args:
        text: the reply.
    """


ACTION_TOOLS: tuple[Tool, ...] = tuple(
    Tool.from_function(fn, name=fn.__name__.removesuffix("_text"))
    for fn in (click, type_text, select, goto, back, scroll, answer)
)
"""The tools, in the order the system prompt lists them."""
BROWSER_ACTIONS = frozenset(t.name for t in ACTION_TOOLS) - {"answer"}
"""The actions `BrowserSession.act` runs."""
