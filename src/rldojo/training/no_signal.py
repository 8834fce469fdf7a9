"""Why a step had no learning signal: one line with the likely cause, said when it matters.

GRPO learns only from groups whose rewards differ (`rollout/groups_informative`); a step
without one trains nothing, and its step line (`reward +0.00 pass 0.00 ... groups 0/16`)
does not say why. `SignalWatch.observe(step, metrics)` reads a step's metrics
(`rldojo.training.step_metrics.rollout_metrics`) and, when no group was informative, names
the likeliest cause from what was measured, the first that applies:

1. failures: at least `SHARE` of the rollouts or their grades failed (statuses);
2. too easy: every graded completion passed (whatever the token limit cut: a cut
   completion that passes is not why nothing was learnt), or the reward passes everything;
3. truncation: at least `SHARE` of the completions hit `sampling.max_new_tokens`
   (`signal/truncated`), so most were cut before any answer;
4. no answer: at least `SHARE` had no answer the grader could extract
   (`signal/no_answer`), named with the format the environment expects when it says;
5. too hard: nothing passed and no reward was above 0 (or the rewards differed between
   groups only);
6. a constant reward: every reward was the same value above 0 that does not pass (e.g.
   all 0.3): the reward does not vary, so no completion is better than another;
7. otherwise every group was all-pass or all-fail on its own: the group is too small or
   the sampling too cold to tell completions apart.

It says so on the first step without signal, again when the cause changes, and after
`every` (`EVERY` = 10) further steps without signal with the same cause, so a long run's
log stays readable and a cause that persists is said again. Steps with signal say nothing
and do not count. The line starts with `warning: ` (a console prints it under the step
line; the Python API logs it at WARNING, `rldojo.training.callbacks.LoggingCallback`).

`no_signal_report` reads every step of a run (the ledger's step metrics, so a resumed run
counts the steps before its resume) and groups the steps without signal by cause:
summary.json's `no_signal`, the Python API's `RunResult.diagnosis`.

    watch = signal_watch(trainer.config, trainer.envs)
    line = watch.observe(trainer.step_num, metrics)   # None, or the line to print
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rldojo.config import TrainConfig
from rldojo.rollout.mixture import EnvMixture

__all__ = ["SHARE", "Diagnosis", "NoSignal", "SignalWatch", "diagnose", "expected_answer",
           "no_signal_report", "signal_watch"]  # fmt: skip

SHARE = 0.5
"""A measured share at or above this is reported as the cause (a majority of the step)."""
EVERY = 10
"""Steps without signal, with an unchanged cause, between two reports."""


@dataclass(frozen=True)
class Diagnosis:
    """The cause of a step without signal: a short key (which changes trigger a new
    report) and the text of the line."""

    cause: str  # failures | too_easy | truncated | no_answer | too_hard | constant_reward
    #             | equal_groups
    text: str


@dataclass(frozen=True)
class NoSignal:
    """The steps of a run without learning signal that had one cause (summary.json's
    `no_signal` holds one per cause, in the order the causes first appeared)."""

    cause: str
    """The `Diagnosis.cause`: failures, too_easy, truncated, no_answer, too_hard,
    constant_reward or equal_groups."""
    steps: tuple[int, ...]
    """The steps (1-based) without an informative group that had this cause."""
    text: str
    """What the diagnosis said at the last of those steps."""

    def as_dict(self) -> dict[str, Any]:
        return {"cause": self.cause, "steps": list(self.steps), "text": self.text}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NoSignal:
        return cls(str(data["cause"]), tuple(int(s) for s in data["steps"]), str(data["text"]))


def _share(value: float) -> str:
    return f"{value:.0%}"


def _failed(metrics: Mapping[str, Any]) -> tuple[float, str]:
    """The share of rollouts that failed or whose grade failed, and the statuses seen."""
    counts = {
        k: int(v) for k, v in metrics.items() if k.startswith(("rollout/status_", "grade/status_"))
    }
    total = max(int(metrics.get("rollout/samples", 0)), 1)
    shown = ", ".join(f"{k.split('/', 1)[1]} {n}" for k, n in sorted(counts.items()))
    return min(sum(counts.values()) / total, 1.0), shown


def diagnose(
    metrics: Mapping[str, Any], max_new_tokens: int, expects: str | None = None
) -> Diagnosis:
    """The likeliest cause of a step without informative groups (see the module docstring)."""
    failed, statuses = _failed(metrics)
    if failed >= SHARE:
        return Diagnosis(
            "failures",
            f"{_share(failed)} of rollouts or grades failed ({statuses}): "
            "the ledger's errors say why",
        )
    passed = float(metrics.get("reward/pass_rate", 0.0))
    reward = float(metrics.get("reward/mean", 0.0))
    if passed == 1.0:
        return Diagnosis(
            "too_easy",
            f"every completion passed (reward {reward:+.2f}): too easy, or the reward "
            "passes everything; give harder tasks (e.g. a higher level)",
        )
    cut = float(metrics.get("signal/truncated", 0.0))
    missing = float(metrics.get("signal/no_answer", 0.0))
    if cut >= SHARE:
        also = f"; {_share(missing)} had no extractable answer" if missing >= SHARE else ""
        return Diagnosis(
            "truncated",
            f"{_share(cut)} of completions hit sampling.max_new_tokens = {max_new_tokens}: "
            f"raise it{also}",
        )
    if missing >= SHARE:
        fix = f"the env expects {expects}" if expects else "check the answer format it asks for"
        return Diagnosis("no_answer", f"{_share(missing)} had no extractable answer: {fix}")
    return _by_rewards(passed, reward, _constant(metrics))


def _constant(metrics: Mapping[str, Any]) -> bool:
    """Every graded reward of the step had the same value (False when not measured)."""
    spread = metrics.get("reward/std")
    return spread is not None and float(spread) <= 1e-9


def _by_rewards(passed: float, reward: float, constant: bool) -> Diagnosis:
    """The cause when no completion was cut or unanswered: the rewards themselves."""
    if passed == 0.0 and (not constant or reward <= 0.0):
        return Diagnosis(
            "too_hard",
            f"no completion passed (reward {reward:+.2f}): too hard for the model; "
            "turn on curriculum or lower the task's level",
        )
    if constant:
        return Diagnosis(
            "constant_reward",
            f"every reward was {reward:+.2f}: the reward does not vary, so no completion "
            "is better than another; check that it reads the completion",
        )
    return Diagnosis(
        "equal_groups",
        f"{_share(passed)} passed, but every group was all-pass or all-fail: "
        "raise rollout.group_size or sampling.temperature",
    )


class SignalWatch:
    """Watches steps for missing learning signal; `observe` returns the line to print.

    Args:
        max_new_tokens: the run's `sampling.max_new_tokens` (named in the advice).
        expects: what the environment's grader extracts an answer from, e.g.
            ``"<answer>…</answer>"``; None when unknown.
        every: steps without signal, with the same cause, between two reports.
    """

    def __init__(self, max_new_tokens: int, expects: str | None = None, every: int = EVERY):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.max_new_tokens = max_new_tokens
        self.expects = expects
        self.every = every
        self._cause: str | None = None  # of the last report
        self._quiet = 0  # steps without signal since the last report

    def observe(self, step: int, metrics: Mapping[str, Any]) -> str | None:
        """None for a step with signal (or without group counts); for a step without,
        the line saying why, when it is due (see the module docstring)."""
        informative = metrics.get("rollout/groups_informative")
        if informative is None or informative > 0:
            return None
        found = diagnose(metrics, self.max_new_tokens, self.expects)
        if found.cause == self._cause and self._quiet + 1 < self.every:
            self._quiet += 1
            return None
        self._cause, self._quiet = found.cause, 0
        groups = int(metrics.get("rollout/groups", 0))
        return (
            f"warning: no learning signal at step {step} (0 of {groups} groups "
            f"informative): {found.text}"
        )

    def report(self, steps: Iterable[Mapping[str, Any]]) -> list[NoSignal]:
        """`no_signal_report` with this watch's token limit and answer format."""
        return no_signal_report(steps, self.max_new_tokens, self.expects)


def no_signal_report(
    steps: Iterable[Mapping[str, Any]], max_new_tokens: int, expects: str | None = None
) -> list[NoSignal]:
    """The steps without an informative group among `steps` (each step's metrics with its
    `step`, as `Ledger.step_metrics` returns them), grouped by cause in the order the
    causes first appeared; each with the text of its last step. Empty: every step had
    signal (or none was measured)."""
    found: dict[str, tuple[list[int], str]] = {}
    for metrics in steps:
        if metrics.get("rollout/groups_informative", 1) > 0:
            continue
        why = diagnose(metrics, max_new_tokens, expects)
        seen, _ = found.setdefault(why.cause, ([], why.text))
        seen.append(int(metrics["step"]))
        found[why.cause] = (seen, why.text)
    return [NoSignal(cause, tuple(seen), text) for cause, (seen, text) in found.items()]


def expected_answer(config: TrainConfig, envs: EnvMixture) -> str | None:
    """What the run's graders extract an answer from: the environments' `expected_answer`
    (one of each environment of `envs`), joined with " or " when they differ; None when a
    grader spec replaces their graders or none of them says."""
    if config.grader.spec is not None:
        return None
    found = [getattr(slot.make(), "expected_answer", None) for slot in envs.slots.values()]
    kinds = list(dict.fromkeys(f for f in found if isinstance(f, str)))
    return " or ".join(kinds) or None


def signal_watch(config: TrainConfig, envs: EnvMixture) -> SignalWatch:
    """The watch for a run: its token limit and its environments' answer format."""
    return SignalWatch(config.sampling.max_new_tokens, expected_answer(config, envs))
