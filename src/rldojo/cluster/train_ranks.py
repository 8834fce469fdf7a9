"""Training ranks as Ray actors: what torchrun does on one machine, on a Ray cluster.

With `run.cluster = "ray"` and `run.train_ranks = N` (N > 1), `rldojo train` starts N
`TrainRank` actors in one placement group (one bundle each: a CPU and
`run.train_rank_gpus` GPUs, packed onto as few nodes as fit), gives each the environment
torchrun would (`MASTER_ADDR` and `MASTER_PORT`, a free port on rank 0's node, `RANK`,
`WORLD_SIZE`, `LOCAL_RANK`) and has each call the same entry: the training loop, which
joins the process group from that environment (`rldojo.training.distributed`). Rank 0
writes the run directory and owns the Ray rollout workers, as under torchrun.

The launching process waits for every rank and prints rank 0's console output as it
comes (rank 0 writes it into a buffer the launcher drains), then returns rank 0's result.
A rank that raises makes the launcher wait for the others — at most the collective
timeout (`run.dist_timeout_s`), after which every rank has ended — and re-raise the
rank's own exception (rank 0's when several raised, as every rank raises a stop rank 0
broadcast). A rank whose actor dies (killed, out of memory, its node lost) makes the
launcher stop the others at once and raise `RankError` naming it: a rank never waits on
a dead peer for longer than its collective timeout, and the launcher never waits at all.

This layer does not import the training loop; the loop passes itself in (`entry`, a
module-level function, which Ray sends by its qualified name).
"""

from __future__ import annotations

import io
import os
import threading
import time
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:
    from ray import ObjectRef

__all__ = ["RankError", "TrainRank", "run_on_ranks"]

POLL_S = 0.2
"""How often the launcher looks for finished ranks and relays rank 0's output."""


class RankError(RuntimeError):
    """The training ranks could not start, or one was lost; the message is one line."""


class _Relay(io.StringIO):
    """A text file rank 0's console writes into and the launcher drains (thread-safe: the
    actor serves `output` while `run` trains)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            return super().write(text)

    def drain(self) -> str:
        """What was written since the last drain."""
        with self._lock:
            text = self.getvalue()
            self.seek(0)
            self.truncate()
        return text


class TrainRank:
    """Actor body: one training rank. Threaded (two calls at once): `run` trains while
    `output` hands the launcher what rank 0 printed."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self._relay = _Relay()

    def node(self) -> str:
        """This rank's node address (ranks on one node number their `LOCAL_RANK`s)."""
        import ray

        return str(ray.util.get_node_ip_address())

    def free_port(self) -> int:
        """A port free on this node now, for rank 0's rendezvous (`MASTER_PORT`)."""
        import socket

        with socket.socket() as s:
            s.bind(("", 0))
            return int(s.getsockname()[1])

    def run(
        self,
        entry: Callable[..., dict[str, Any]],
        kwargs: Mapping[str, Any],
        env: Mapping[str, str],
        width: int,
    ) -> dict[str, Any]:
        """`entry(**kwargs, console=...)` as this rank: `env` set first, rank 0's console
        printing into the relay (`width` columns, plain text), the others' silent."""
        import ray

        os.environ.update(env)
        if ray.get_gpu_ids():  # Ray shows a rank only the GPU it reserved: its cuda:0
            os.environ["LOCAL_RANK"] = "0"
        console = None
        if self.rank == 0:
            console = Console(
                file=self._relay, width=width, force_terminal=False, no_color=True, soft_wrap=True
            )
        return entry(**kwargs, console=console)

    def output(self) -> str:
        """What rank 0 printed since the last call."""
        return self._relay.drain()


def run_on_ranks(
    entry: Callable[..., dict[str, Any]],
    kwargs: Mapping[str, Any],
    *,
    ranks: int,
    gpus: float = 0.0,
    address: str | None = None,
    timeout_s: float = 600.0,
    console: Console | None = None,
    on_loss: str = "",
) -> dict[str, Any]:
    """Run `entry(**kwargs, console=...)` on `ranks` Ray actors (each with the torchrun
    environment of its rank) on the cluster at `address` (None: the one this process is
    connected to, else a new local one); rank 0's output goes to `console`. Returns rank
    0's result. Raises `RankError` when the cluster has no room for the ranks within
    `timeout_s` or a rank's actor died (`on_loss` ends that message), else the
    exception a rank raised."""
    ray = _ray()
    if not ray.is_initialized():
        ray.init(
            address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True
        )
    group = _RankGroup(ray, ranks, gpus, timeout_s)
    try:
        group.start(entry, kwargs, console.width if console is not None else 100)
        return group.wait(console, on_loss)
    finally:
        group.close()


class _RankGroup:
    """The ranks' placement group and actors, and the launcher's side of their run."""

    def __init__(self, ray: ModuleType, ranks: int, gpus: float, timeout_s: float) -> None:
        self.ray, self.world, self.timeout_s = ray, ranks, timeout_s
        bundle = {"CPU": 1.0, **({"GPU": gpus} if gpus > 0 else {})}
        self.bundle = bundle
        from ray.util.placement_group import placement_group

        self.pg = placement_group([bundle] * ranks, strategy="PACK")
        self.actors: list[Any] = []
        self.runs: dict[Any, int] = {}  # the ranks' `run` calls in flight, to their rank

    def start(
        self, entry: Callable[..., dict[str, Any]], kwargs: Mapping[str, Any], width: int
    ) -> None:
        """Reserve the bundles, start the actors, give each its environment, call `run`."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        ray = self.ray
        try:
            ray.get(self.pg.ready(), timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError:
            raise RankError(
                f"the Ray cluster has no room for {self.world} training ranks of "
                f"{self.bundle} each (waited {self.timeout_s:g} s, "
                "run.dist_timeout_s)"
            ) from None
        actor = ray.remote(num_cpus=1, num_gpus=self.bundle.get("GPU", 0), max_concurrency=2)(
            TrainRank
        )
        self.actors = [
            actor.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.pg, placement_group_bundle_index=r
                )
            ).remote(r, self.world)
            for r in range(self.world)
        ]
        try:
            nodes = ray.get([a.node.remote() for a in self.actors], timeout=self.timeout_s)
            port = ray.get(self.actors[0].free_port.remote(), timeout=self.timeout_s)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
            raise RankError(f"a training rank could not start: {_first_line(exc)}") from None
        for r, a in enumerate(self.actors):
            env = {
                "MASTER_ADDR": nodes[0],
                "MASTER_PORT": str(port),
                "RANK": str(r),
                "WORLD_SIZE": str(self.world),
                "LOCAL_RANK": str(nodes[:r].count(nodes[r])),
            }
            self.runs[a.run.remote(entry, kwargs, env, width)] = r

    def wait(self, console: Console | None, on_loss: str) -> dict[str, Any]:
        """Rank 0's result once every rank ended, relaying its output meanwhile. After a
        rank raised, the others get `timeout_s` (their collectives' timeout) to end; a
        rank that died ends the wait at once."""
        ray, pending = self.ray, dict(self.runs)
        outcome: dict[int, Any] = {}  # rank: its result or its exception
        deadline: float | None = None
        while pending and (deadline is None or time.monotonic() < deadline):
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=POLL_S)
            self._relay(console)
            for ref in ready:
                outcome[pending.pop(ref)] = self._result(ref)
            if any(isinstance(o, ray.exceptions.RayActorError) for o in outcome.values()):
                break
            if deadline is None and any(isinstance(o, BaseException) for o in outcome.values()):
                deadline = time.monotonic() + self.timeout_s + 30  # their timeout, then some
        self._relay(console)
        lost = sorted(r for r, o in outcome.items() if isinstance(o, ray.exceptions.RayActorError))
        if lost:
            why = _first_line(outcome[lost[0]])
            raise RankError(
                f"training rank {lost[0]} of {self.world} was lost ({why}); the "
                f"other ranks were stopped{on_loss}"
            )
        raised = {r: o for r, o in outcome.items() if isinstance(o, BaseException)}
        if raised:
            raise raised[min(raised)] from None  # rank 0's, when it raised
        return dict(outcome[0])

    def _result(self, ref: ObjectRef[dict[str, Any]]) -> dict[str, Any] | BaseException:
        """A rank's result; the exception it raised (as its own type), or the death of
        its actor (`RayActorError`)."""
        ray = self.ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause
            return cause if isinstance(cause, BaseException) else exc
        except ray.exceptions.RayActorError as exc:
            return exc

    def _relay(self, console: Console | None) -> None:
        """Print what rank 0 printed since the last call (nothing once it is gone)."""
        if console is None or not self.actors:
            return
        try:
            text = self.ray.get(self.actors[0].output.remote(), timeout=self.timeout_s)
        except (self.ray.exceptions.RayActorError, self.ray.exceptions.GetTimeoutError):
            return
        if text:
            console.file.write(text)
            console.file.flush()

    def close(self) -> None:
        """Stop every rank's actor (ended or not) and free their bundles."""
        for actor in self.actors:
            self.ray.kill(actor, no_restart=True)
        self.actors = []
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(self.pg)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def _ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise RuntimeError("run.train_ranks > 1 needs Ray: pip install 'rldojo[ray]'") from exc
    return ray
