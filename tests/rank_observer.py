"""The child of the sharded-training tests: the real CLI (`rldojo.cli.main`), under
torchrun or alone, with one observer around the optimizer step of an objective's module
(`clipped_step`). Environment variables steer it:

    DUMP_GRADS=DIR   rank 0 writes each call's whole gradients (gathered from the shards,
                     before the optimizer moves) to DIR/<call>.pt
    KILL_AT=N, KILL_RANK=R, KILLED_AT=FILE
                     rank R SIGKILLs itself on call N, after writing the time to FILE

`launch(tmp, module, ranks, args, env)` runs `rldojo ARGS` on `ranks` ranks (torchrun
for more than one) with `tests/` on the path (coin_env) and one thread per rank. The
processes fork from a warm interpreter (tests/warm.py: torch, transformers and rldojo
imported): the launcher, and each rank through the stand-in `python` torchrun is given
(`--no-python`); a rank that dies of a signal shows to torchrun as that signal's exit code.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import warm

CHILD = """
import importlib, os, signal, sys, time, torch
module = importlib.import_module(sys.argv[1])
rank, calls, original = int(os.environ.get("RANK", "0")), [0], module.clipped_step
def observed(optimizer, params, max_norm):
    calls[0] += 1
    params = list(params)
    if os.environ.get("DUMP_GRADS"):
        grads = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                 for p in params]
        if rank == 0:
            torch.save(grads, os.path.join(os.environ["DUMP_GRADS"], f"{calls[0]}.pt"))
    if calls[0] == int(os.environ.get("KILL_AT", "0")) and rank == int(os.environ["KILL_RANK"]):
        with open(os.environ["KILLED_AT"], "w") as f:
            f.write(str(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    return original(optimizer, params, max_norm)
module.clipped_step = observed
sys.argv = ["rldojo", *sys.argv[2:]]
from rldojo.cli import main
main()
"""


def child_env(**extra: str) -> dict[str, str]:
    """The children's environment: one thread, `tests/` importable, plus `extra`."""
    tests = str(Path(__file__).parent)
    path = os.pathsep.join(p for p in (tests, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **extra}


def launch(tmp: Path, module: str, ranks: int, args: list[str],
           **env: str) -> subprocess.CompletedProcess:  # fmt: skip
    """`rldojo ARGS` with the observer on `module`'s `clipped_step`, to the end."""
    script = tmp / "child.py"
    script.write_text(CHILD)
    environ = child_env(**env)
    launcher = [sys.executable, str(script)]
    if ranks > 1:  # `-u`, as torchrun runs python
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", str(ranks), "--no-python", warm.python(environ), "-u",
                    str(script)]  # fmt: skip
    return warm.run([*launcher, module, *args], capture_output=True, text=True, timeout=600,
                    env=environ)  # fmt: skip


def resume(command: str, run: Path, ranks: int) -> subprocess.CompletedProcess:
    """`rldojo COMMAND --resume RUN --nproc RANKS`, the one-command form."""
    line = [sys.executable, "-m", "rldojo", command, "--resume", str(run), "--nproc", str(ranks)]
    return warm.run(line, capture_output=True, text=True, timeout=600, env=child_env())
