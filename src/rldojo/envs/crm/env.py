"""`CrmEnv`: the crm-v1 environment — a CRM digital twin with snapshot, restore and fork.

An episode: `reset` deserializes the task's start database (built once per process per
database seed, see `rldojo.envs.crm.data.base_snapshot`); every policy turn runs its
tool calls against the live database; the episode ends at ``<answer>`` or a limit. Each
step's info carries the running diff of the database (``crm/diff``) and, at the end, a
digest of the whole state (``crm/digest``); `CrmGrader` scores them.

Snapshot = the serialized database (``sqlite3.Connection.serialize``, one memcpy of a
few hundred KB) plus the pickled episode; restore = ``deserialize`` plus unpickling.
Both take well under a millisecond at the default size
(``benchmarks/env_throughput.py``), so the N rollouts of a group start from one snapshot
and any rollout can be forked mid-episode (`fork()`) into independent branches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field, field_validator

from rldojo.envs.crm.api import CrmApi
from rldojo.envs.crm.data import DbSize, base_snapshot, connect, diff, state_digest
from rldojo.envs.crm.grader import CrmGrader, CrmReward
from rldojo.envs.crm.query import search_tool, sql_tool
from rldojo.envs.crm.scenarios import KNOWLEDGE_BASE
from rldojo.envs.crm.tasks import scenario_tasks
from rldojo.envs.kwargs import EpisodeLimits, ToolEnvKwargs, subset_of
from rldojo.envs.multiturn import ToolEnv
from rldojo.envs.tools import Tool
from rldojo.types import Task

__all__ = ["ENV_ID", "CrmDatabaseKwargs", "CrmEnv", "CrmKwargs"]

ENV_ID = "crm-v1"

INSTRUCTIONS = (
    "You are the CRM assistant of a sales and support team. Use the tools to look up and "
    "change CRM records; never guess ids, look them up. Change only what the user asks for. "
    "End with your reply to the user in <answer>...</answer>, stating the facts they asked "
    "for, or plainly what could not be done."
)


class CrmDatabaseKwargs(ToolEnvKwargs):
    """The kwargs of the CRM twins' databases and reward (crm-v1, web-crm-v1)."""

    db_size: DbSize = "default"
    """Accounts per database: 20, 60 or 400 (contacts, deals, tickets scale with it)."""
    n_databases: int = Field(4, gt=0)
    """Distinct start databases per split; task i uses database i % n_databases (fewer
    databases, more reuse of cached snapshots)."""
    reward: CrmReward = CrmReward()
    """Weights and penalties of the reward (a table; keys left out keep these)."""


class CrmKwargs(CrmDatabaseKwargs):
    """The kwargs of crm-v1 (`[env] kwargs`); the tool-use ones are `ToolEnvKwargs`'."""

    levels: Sequence[int] = (1, 2, 3, 4)
    """Difficulty levels to draw tasks from, a non-empty subset of 1 (lookup), 2 (one
    update), 3 (several steps), 4 (conditional updates)."""
    sql: bool = True
    """Also offer the read-only ``sql`` tool."""
    limits: EpisodeLimits = EpisodeLimits(max_turns=10)
    """Per-episode limits (a table); keys left out keep crm-v1's: max_turns = 10 and the
    other defaults."""

    @field_validator("levels")
    @classmethod
    def _known_levels(cls, levels: Sequence[int]) -> tuple[int, ...]:
        return subset_of(levels, (1, 2, 3, 4))


class CrmEnv(ToolEnv):
    """crm-v1 (see the package docstring of `rldojo.envs.crm`); built from `CrmKwargs` (or
    keywords validated against it)."""

    env_id = ENV_ID
    instructions = INSTRUCTIONS
    Kwargs = CrmKwargs
    kwargs: CrmKwargs

    def __init__(self, kwargs: CrmKwargs | None = None, /, **keywords: object) -> None:
        super().__init__(kwargs, **keywords)
        self.levels = tuple(self.kwargs.levels)
        self.reward = self.kwargs.reward
        self.conn = connect()
        self._db_key: tuple[int, str] | None = None
        self.conn.deserialize(base_snapshot(0, self.kwargs.db_size))  # a schema before a reset

    # ---------------------------------------------------------------- tasks and tools

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> list[Task]:
        return scenario_tasks(
            ENV_ID,
            split,
            seed=seed,
            n=n,
            levels=self.levels,
            n_databases=self.kwargs.n_databases,
            db_size=self.kwargs.db_size,
        )

    def build_tools(self) -> list[Tool]:
        tools = CrmApi(self.conn).tools()
        tools.append(
            search_tool(
                KNOWLEDGE_BASE,
                name="search_kb",
                description="Search the company knowledge base (policies, procedures).",
            )
        )
        if self.kwargs.sql:
            tools.append(sql_tool(self.conn))
        return tools

    def default_grader(self) -> CrmGrader:
        return CrmGrader(self.reward)

    # ---------------------------------------------------------------- episode and state

    async def setup(self, task: Task, seed: int) -> None:
        db = task.info.get("db") or {}
        key = (int(db.get("seed", 0)), str(db.get("size", self.kwargs.db_size)))
        self.conn.deserialize(base_snapshot(*key))
        self._db_key = key

    def state_info(self) -> dict[str, Any]:
        changes = diff(self.conn)
        info: dict[str, Any] = {"crm/diff": changes, "crm/changed_rows": len(changes)}
        if self.episode.done:
            info["crm/digest"] = state_digest(self.conn)
        return info

    def save_state(self) -> bytes:
        return self.conn.serialize()

    def load_state(self, state: object) -> None:
        assert isinstance(state, bytes), "a snapshot's world is the serialized database"
        self.conn.deserialize(state)

    def digest(self) -> str:
        """SHA-256 of the database's rows (equal states have equal digests)."""
        return state_digest(self.conn)

    def __del__(self) -> None:
        conn = getattr(self, "conn", None)
        if conn is not None:
            conn.close()
