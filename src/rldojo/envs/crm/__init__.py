"""crm-v1: a CRM digital twin for training agents that change real-looking records.

A SQLite database of accounts, contacts, deals, tickets, activities and an email outbox,
generated deterministically from a seed (`data`); the tools of a CRM API with the
validation errors of a real one (`api`), plus knowledge-base search and read-only SQL
(`query`); task scenarios from templates at four difficulty levels (`scenarios`); and a
reward computed from the end state: expected changes made, no collateral changes, and the
facts the user asked for stated in the final answer (`grader`). `CrmEnv` (`env`)
snapshots, restores and forks the full state in well under a millisecond.

    env = make_env("crm-v1", levels=[1, 2])
    task = env.tasks("train", seed=0, n=1)[0]
    obs = await env.reset(task, seed=0)
    result = await env.step('<tool_call>{"name": "search_accounts", '
                            '"arguments": {"query": "Acme"}}</tool_call>')
"""

from rldojo.envs.crm.env import ENV_ID, CrmEnv
from rldojo.envs.crm.grader import CrmGrader, CrmReward
from rldojo.envs.registry import register

__all__ = ["CrmEnv", "CrmGrader", "CrmReward"]

register(ENV_ID, CrmEnv)
