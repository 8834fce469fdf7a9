"""The thread plan never adds up to more busy threads than cores unless asked to."""

from __future__ import annotations

from rldojo.hardware.threads import plan_threads


def test_plain_run_uses_every_core() -> None:
    plan = plan_threads(cores=2)
    assert (plan.torch_threads, plan.ray_worker_threads, plan.notes) == (2, None, ())
    assert plan.describe() == "2 cores; trainer 2 torch threads"


def test_explicit_threads_and_omp_env() -> None:
    assert plan_threads(cores=8, threads=3).torch_threads == 3
    assert plan_threads(cores=8, omp_env="4").torch_threads == 4
    assert plan_threads(cores=8, omp_env="junk").torch_threads == 8
    assert plan_threads(cores=8, threads=2, omp_env="4").torch_threads == 2  # config wins
    over = plan_threads(cores=2, threads=4)
    assert over.notes == ("oversubscribed: run.threads = 4 on 2 cores",)


def test_synchronous_local_ray_workers_split_the_cores() -> None:
    plan = plan_threads(cores=8, ray_workers=2)
    assert (plan.torch_threads, plan.ray_worker_threads) == (8, 4)  # trainer waits meanwhile
    assert not any("oversubscribed" in n for n in plan.notes)


def test_async_local_ray_workers_share_with_the_trainer() -> None:
    plan = plan_threads(cores=8, ray_workers=3, async_lag=1)
    assert (plan.ray_worker_threads, plan.torch_threads) == (2, 2)  # 3*2 + 2 = 8
    tiny = plan_threads(cores=2, ray_workers=2, async_lag=1)
    assert (tiny.ray_worker_threads, tiny.torch_threads) == (1, 1)
    assert tiny.notes == ("oversubscribed: 3 busy threads on 2 cores",)


def test_remote_ray_keeps_the_trainer_whole() -> None:
    plan = plan_threads(cores=4, ray_workers=4, ray_local=False, async_lag=1)
    assert (plan.torch_threads, plan.ray_worker_threads) == (4, None)
    assert plan_threads(cores=4, ray_workers=4, ray_local=False,
                        ray_worker_threads=8).ray_worker_threads == 8  # fmt: skip


def test_in_process_async_and_workers_are_noted() -> None:
    plan = plan_threads(cores=2, async_lag=1, env_workers=2, grade_in_workers=True)
    assert plan.torch_threads == 2
    assert plan.notes[0].startswith("async in process")
    assert "2 environment worker processes" in plan.notes[1]
    assert plan.as_dict()["notes"] == plan.notes
