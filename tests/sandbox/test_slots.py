"""Slot uids: a uid that a killed claimant's stranded sandbox still runs as is not free.

(Seen in CI: a bwrap whose pool died blocked on its start fd for an hour as uid 60006; the
next pool claimed 60006, and its leftover checks counted the stranger.)"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from rldojo.sandbox.slots import claim_slot, processes_of_uid, release_slot

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="claiming uids needs root")

BASE = 61_000  # away from the pools' own uids (60000...)


def test_a_uid_a_stranded_process_runs_as_is_skipped():
    free = claim_slot(0, base_uid=BASE, cgroup=False)
    uid = free.uid
    release_slot(free)  # its lock is free again, as a killed claimant's would be
    stranger = subprocess.Popen(["/bin/sleep", "600"], user=uid, group=uid, cwd="/")
    try:
        deadline = time.monotonic() + 60
        while not processes_of_uid(uid) and time.monotonic() < deadline:
            time.sleep(0.01)  # until the child has dropped to the uid
        assert processes_of_uid(uid) == [stranger.pid]
        slot = claim_slot(0, base_uid=BASE, cgroup=False)
        assert slot.uid is not None and slot.uid != uid
        release_slot(slot)
    finally:
        stranger.kill()
        stranger.wait()
    slot = claim_slot(0, base_uid=BASE, cgroup=False)  # free again once it is gone
    assert slot.uid == uid
    release_slot(slot)
