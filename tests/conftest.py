"""Shared fixtures: the tiny random model (SmolLM2's tokenizer, 2 random layers); and the
guard of the fast tier.

Two tiers: `make test` runs every test; `make test-fast` (`pytest -m "not slow"`) leaves
out the tests marked `slow`: those that load a model or tokenizer, start a process,
server or browser, or take over ~0.3 s. A file of such tests says so once
(`pytestmark = pytest.mark.slow`); a mixed file marks its slow tests one by one. A test
outside the slow tier that loads a model fails, saying to mark it.
"""

from __future__ import annotations

import os

import pytest
import torch

from rldojo.policy import models

_GUARD = pytest.StashKey[pytest.MonkeyPatch]()
_UNMARKED = "not marked slow: add @pytest.mark.slow (`make test-fast` runs -m 'not slow')"


def _refuse_to_load(name: str, *_args: object, **_kwargs: object) -> None:
    raise RuntimeError(f"this test loads the model {name!r} but is {_UNMARKED}")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Outside the slow tier, from fixture setup to teardown, `load_tokenizer` (the first
    step of every `load_model`) raises; the session's `tiny` model is refused too, since
    an earlier slow test may have loaded it already."""
    if item.get_closest_marker("slow") is not None:
        return
    if "tiny" in getattr(item, "fixturenames", ()):
        pytest.fail(f"this test uses the `tiny` model but is {_UNMARKED}", pytrace=False)
    guard = pytest.MonkeyPatch()
    guard.setattr(models, "load_tokenizer", _refuse_to_load)
    item.stash[_GUARD] = guard


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    guard = item.stash.get(_GUARD, None)
    if guard is not None:
        guard.undo()


LONGEST_FIRST = (
    "tests/benchmarks/test_dry_runs.py",
    "tests/service/test_jobs.py",
    "tests/training/test_sft.py",
    "tests/cluster/test_ray.py",
    "tests/rollout/test_faults.py",
    "tests/training/test_sharded_rl.py",
    "tests/training/test_sharded.py",
    "tests/benchmarks/test_gpu_check_dry.py",
    "tests/training/test_resume_objectives.py",
    "tests/test_cli_errors.py",
    "tests/cluster/test_train_ranks.py",
    "tests/training/test_trainer.py",
    "tests/service/test_outcomes.py",
    "tests/test_docs.py",
    "tests/envs/test_check_env.py",
    "tests/service/test_judge.py",
    "tests/commands/test_sft_recipe.py",
    "tests/training/test_lora.py",
    "tests/training/test_two_nodes.py",
    "tests/commands/test_pipeline.py",
    "tests/service/test_ray.py",
    "tests/training/test_activations.py",
    "tests/envs/web_crm/test_browser.py",
    "tests/test_api.py",
    "tests/service/test_supervised.py",
    "tests/test_agentic_gpu_dry.py",
    "tests/rollout/test_kill_anywhere.py",
    "tests/test_device.py",
    "tests/rollout/test_async.py",
    "tests/test_cli.py",
    "tests/report/test_trackers.py",
    "tests/envs/web_crm/test_env.py",
    "tests/service/test_durability.py",
    "tests/training/test_interrupts.py",
    "tests/training/test_sharded_distill.py",
    "tests/rollout/test_resume.py",
    "tests/policy/test_smollm2_export.py",
)
"""The test files that take longest (`make test`, idle 2-core machine), longest first.
`make test` hands files to its two xdist workers in collection order
(`--dist loadfile --no-loadscope-reorder`): these go first, so that the suite does not end
with one worker on a long file while the other idles. A file left out goes after them, in
its usual order; the list is a schedule, not a set of rules (re-rank it from
`--durations` when a file's time changes much)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    root = config.rootpath

    def key(item: pytest.Item) -> int:
        try:
            return rank.get(item.path.relative_to(root).as_posix(), len(rank))
        except ValueError:
            return len(rank)

    items.sort(key=key)  # stable: within a file and among the rest, the collected order


@pytest.fixture(scope="session")
def tiny():
    """`(model, tokenizer)` of `tiny-random`, built once per session."""
    from rldojo.policy.models import load_model

    torch.manual_seed(0)
    return load_model("tiny-random")


@pytest.fixture
def nudged_student(tmp_path, tiny):
    """A directory holding `tiny-random` nudged (seed 3, 0.05 noise on every weight): a
    distillation student whose distributions differ from the `tiny-random` teacher's."""
    import copy

    model, tokenizer = tiny
    student = copy.deepcopy(model)
    torch.manual_seed(3)
    with torch.no_grad():
        for p in student.parameters():
            p.add_(0.05 * torch.randn_like(p))
    student.save_pretrained(tmp_path / "student0")
    tokenizer.save_pretrained(tmp_path / "student0")
    return tmp_path / "student0"


@pytest.fixture(scope="session", autouse=True)
def _ray_without_tokens():
    """Ray (2.60) turns token authentication on for a new local cluster and writes a token
    to ~/.ray/auth_token, which outlives the test: a later `ray start` head then demands it
    of clients that do not send it (tests/service/test_ray.py failed so, in whatever order
    the tests ran). The tests' clusters are local and short-lived: no tokens, in this
    process and the ones it starts."""
    old = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    yield
    if old is None:
        os.environ.pop("RAY_AUTH_MODE", None)
    else:
        os.environ["RAY_AUTH_MODE"] = old
