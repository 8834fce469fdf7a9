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
from typing import Any, Literal

from pydantic import Field

from rldojo.envs.crm.api import CrmApi
from rldojo.envs.crm.data import DB_SIZES, base_snapshot, connect, diff, state_digest
from rldojo.envs.crm.grader import CrmGrader, CrmReward
from rldojo.envs.crm.query import search_tool, sql_tool
from rldojo.envs.crm.scenarios import KNOWLEDGE_BASE
from rldojo.envs.crm.tasks import scenario_tasks
from rldojo.envs.kwargs import EnvKwargs, LimitsKwargs, ToolEnvKwargs
from rldojo.envs.multiturn import EpisodeLimits, ToolEnv
from rldojo.envs.tools import Tool
from rldojo.types import Task

__all__ = ["ENV_ID", "CrmDatabaseKwargs", "CrmEnv", "CrmKwargs", "CrmRewardKwargs"]

ENV_ID = "crm-v1"

INSTRUCTIONS = (
    "You are the CRM assistant of a sales and support team. Use the tools to look up and "
    "change CRM records; never guess ids, look them up. Change only what the user asks for. "
    "End with your reply to the user in <answer>...</answer>, stating the facts they asked "
    "for, or plainly what could not be done."
)


class CrmRewardKwargs(EnvKwargs):
    """`CrmReward` as a table, ``reward = {collateral_penalty = 0.5}`` (see `grader`)."""

    w_state: float = 0.7
    """Weight of the end state: the share of the expected changes made."""
    w_message: float = 0.3
    """Weight of the facts the final answer states (counted once the state is right)."""
    collateral_penalty: float = 0.25
    """Subtracted per change nobody asked for (up to `collateral_cap` of them)."""
    collateral_cap: int = 4
    """Most collateral changes penalised in one episode."""
    false_claim_penalty: float = 0.5
    """Subtracted when the final answer claims work that the end state shows undone."""
    format_penalty: float = 0.2
    """Subtracted when the episode ends without an ``<answer>``."""
    error_penalty: float = 0.05
    """Subtracted per protocol error, e.g. a malformed tool call (up to `error_cap`)."""
    error_cap: int = 5
    """Most protocol errors penalised in one episode."""
    turn_credit: float = 0.0
    """Weight of the per-turn tool-choice credit against the expert's choice, put on each
    turn's tokens (`rldojo.envs.crm.credit`); 0: the outcome alone."""


class CrmDatabaseKwargs(ToolEnvKwargs):
    """The kwargs of the CRM twins' databases and reward (crm-v1, web-crm-v1)."""

    db_size: Literal["small", "default", "large"] = "default"
    """Accounts per database: 20, 60 or 400 (contacts, deals, tickets scale with it)."""
    n_databases: int = Field(4, gt=0)
    """Distinct start databases per split; task i uses database i % n_databases (fewer
    databases, more reuse of cached snapshots)."""
    reward: CrmRewardKwargs | None = None
    """Weights and penalties of the reward (a table); None: the defaults."""


class CrmKwargs(CrmDatabaseKwargs):
    """The kwargs of crm-v1 (`[env] kwargs`); the tool-use ones are `ToolEnvKwargs`'."""

    levels: Sequence[int] = (1, 2, 3, 4)
    """Difficulty levels to draw tasks from, a non-empty subset of 1 (lookup), 2 (one
    update), 3 (several steps), 4 (conditional updates)."""
    sql: bool = True
    """Also offer the read-only ``sql`` tool."""
    limits: LimitsKwargs | None = None
    """Per-episode limits (a table); keys left out keep crm-v1's: max_turns = 10 and the
    other defaults."""


class CrmEnv(ToolEnv):
    """crm-v1 (see the package docstring of `rldojo.envs.crm`); its arguments: `CrmKwargs`."""

    env_id = ENV_ID
    instructions = INSTRUCTIONS
    Kwargs = CrmKwargs
    default_limits = EpisodeLimits(max_turns=10)

    def __init__(
        self,
        levels: Sequence[int] = (1, 2, 3, 4),
        *,
        db_size: str = "default",
        n_databases: int = 4,
        sql: bool = True,
        reward: CrmReward | dict[str, Any] | None = None,
        limits: EpisodeLimits | dict[str, Any] | None = None,
        **tool_env_kwargs: Any,
    ) -> None:
        levels = tuple(int(x) for x in levels)
        if not levels or any(x not in (1, 2, 3, 4) for x in levels):
            raise ValueError(f"{ENV_ID}: levels must be a non-empty subset of (1, 2, 3, 4)")
        if db_size not in DB_SIZES:
            raise ValueError(f"{ENV_ID}: db_size must be one of {sorted(DB_SIZES)}")
        if n_databases < 1:
            raise ValueError(f"{ENV_ID}: n_databases must be >= 1")
        if isinstance(reward, dict):
            reward = CrmReward(**reward)
        super().__init__(
            limits=limits,
            levels=levels,
            db_size=db_size,
            n_databases=n_databases,
            sql=sql,
            reward=reward,
            **tool_env_kwargs,
        )
        self.levels, self.db_size, self.n_databases = levels, db_size, n_databases
        self.sql = sql
        self.reward = reward or CrmReward()
        self.conn = connect()
        self._db_key: tuple[int, str] | None = None
        self.conn.deserialize(base_snapshot(0, db_size))  # a valid schema before any reset

    # ---------------------------------------------------------------- tasks and tools

    def tasks(self, split: str = "train", *, seed: int = 0, n: int | None = None) -> list[Task]:
        return scenario_tasks(
            ENV_ID,
            split,
            seed=seed,
            n=n,
            levels=self.levels,
            n_databases=self.n_databases,
            db_size=self.db_size,
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
        if self.sql:
            tools.append(sql_tool(self.conn))
        return tools

    def default_grader(self) -> CrmGrader:
        return CrmGrader(self.reward)

    # ---------------------------------------------------------------- episode and state

    async def setup(self, task: Task, seed: int) -> None:
        db = task.info.get("db") or {}
        key = (int(db.get("seed", 0)), str(db.get("size", self.db_size)))
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

    def load_state(self, state: Any) -> None:
        self.conn.deserialize(state)

    def digest(self) -> str:
        """SHA-256 of the database's rows (equal states have equal digests)."""
        return state_digest(self.conn)

    def __del__(self) -> None:
        conn = getattr(self, "conn", None)
        if conn is not None:
            conn.close()
