"""crm-v1 snapshot/restore: bit-identical state, independent forks, a group from one snapshot."""

from __future__ import annotations

import asyncio
import json
import pickle

from rldojo.envs.crm import CrmEnv
from rldojo.envs.crm.data import base_snapshot, diff


def run(coro):
    return asyncio.run(coro)


def call(tool: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': tool, 'arguments': arguments})}</tool_call>"


def open_deals(env: CrmEnv) -> list[str]:
    rows = env.conn.execute(
        "SELECT id FROM deals WHERE stage NOT LIKE 'closed%' ORDER BY id LIMIT 3"
    ).fetchall()
    return [r[0] for r in rows]


def started(levels=(2,)) -> tuple[CrmEnv, object]:
    env = CrmEnv(levels=levels, db_size="small", n_databases=1)
    task = env.tasks("train", n=1)[0]
    run(env.reset(task, seed=0))
    return env, task


def test_restore_is_bit_identical():
    env, _ = started()
    d1, d2, _ = open_deals(env)
    run(env.step(call("update_deal", deal_id=d1, amount=1234)))
    snap = env.snapshot()
    image, digest, episode = env.conn.serialize(), env.digest(), env.episode.copy()
    run(env.step(call("update_deal", deal_id=d2, amount=999)))
    run(env.step(call("log_activity", account_id="ACC-0001", type="note", subject="x")))
    assert env.digest() != digest
    env.restore(snap)
    assert env.conn.serialize() == image  # byte for byte, change log included
    assert env.digest() == digest and env.episode == episode
    assert [c["id"] for c in diff(env.conn)] == [d1]
    assert env.snapshot() == snap
    assert pickle.loads(pickle.dumps(snap)) == snap  # can travel to another process


def test_forked_branches_diverge_independently():
    env, _ = started()
    d1, d2, d3 = open_deals(env)
    run(env.step(call("update_deal", deal_id=d1, stage="proposal")))
    left, right = env.fork(), env.fork()
    run(left.step(call("update_deal", deal_id=d2, amount=1111)))
    run(right.step(call("update_deal", deal_id=d3, amount=2222)))
    run(right.step("<answer>done</answer>"))
    changed = {
        name: {c["id"] for c in diff(e.conn)}
        for name, e in (("parent", env), ("left", left), ("right", right))
    }
    assert changed == {"parent": {d1}, "left": {d1, d2}, "right": {d1, d3}}
    assert right.episode.done and not left.episode.done and not env.episode.done
    assert (left.episode.turns, right.episode.turns, env.episode.turns) == (2, 3, 1)
    # Replaying the same actions on a second fork lands on the same state as the first.
    again = env.fork()
    run(again.step(call("update_deal", deal_id=d2, amount=1111)))
    assert again.digest() == left.digest() and again.conn.serialize() == left.conn.serialize()


def test_group_of_rollouts_starts_from_one_snapshot():
    base_snapshot.cache_clear()
    envs = [CrmEnv(levels=(2,), db_size="small", n_databases=1) for _ in range(4)]
    task = envs[0].tasks("train", n=1)[0]
    for e in envs:
        run(e.reset(task, seed=0))
    info = base_snapshot.cache_info()
    assert info.misses == 1 and info.hits >= 4  # one database build for the whole group
    starts = {e.conn.serialize() for e in envs}
    assert len(starts) == 1
    start = envs[0].snapshot()
    for i, e in enumerate(envs):  # each rollout goes its own way
        deal = open_deals(e)[0]
        run(e.step(call("update_deal", deal_id=deal, amount=1000 + i)))
    assert len({e.digest() for e in envs}) == 4
    for e in envs:  # and every one of them can go back to the shared start
        e.restore(start)
    assert {e.conn.serialize() for e in envs} == starts


def test_snapshot_survives_a_new_episode_and_reset_discards_changes():
    env, task = started()
    run(env.step(call("update_deal", deal_id=open_deals(env)[0], amount=4321)))
    snap = env.snapshot()
    run(env.reset(task, seed=0))
    assert diff(env.conn) == [] and env.episode.turns == 0
    env.restore(snap)
    assert len(diff(env.conn)) == 1 and env.episode.turns == 1
