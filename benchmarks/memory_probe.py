"""Where a training step's peak memory is: resident memory per phase of rldojo's step.

    python benchmarks/memory_probe.py [--steps N] [--set key=value ...]
        [--results DIR | --out FILE] [--dry]

Runs rldojo's side of `vs_trl.py` (same settings; `--set` adds config overrides, e.g.
`optim.share_prompt=false`) and samples the process's resident set every 2 ms from a
thread, labelled with the phase the step is in: `generate`, each micro-batch's forward
and backward (`mb1`, `mb2`, ...; within a micro-batch, the decoder layer whose forward
or backward last began: `mb2:f7`, `mb2:b29`), `clip`, `optimizer`. Writes the peak of
each label per step to `benchmarks/results/memory_probe/default.json` (`results_io`; or
`--out FILE`) and prints the labels whose peak is highest. `--dry`: `vs_trl.py --dry`'s
shape (tiny-random, 2 x 4 samples of 8 tokens), one step, into a temporary folder.
Samples every 2 ms: a transient shorter than that can be missed, so read it for where
memory goes, and `vs_trl.py` for the peak (`ru_maxrss`).
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import vs_trl  # its settings and machine description
from results_io import add_result_args, write_result


class Phases:
    """The current phase label and, per label, the highest resident set seen under it."""

    def __init__(self) -> None:
        self.label = "start"
        self.peaks: dict[str, float] = {}
        self._stop = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            rss, label = vs_trl.rss_mib(), self.label
            self.peaks[label] = max(self.peaks.get(label, 0.0), rss)

    def within(self, label: str) -> None:
        """The micro-batch part of the label kept, the layer part replaced."""
        self.label = f"{self.label.split(':')[0]}:{label}"

    def stop(self) -> None:
        self._stop.set()


def instrument(trainer: Any, phases: Phases) -> Any:
    """Label the trainer's phases; returns the function that restarts the micro-batch
    count (call it before each step)."""
    import torch

    from rldojo.training.activations import decoder_layers

    def labelled(obj: Any, name: str, label: Any) -> None:
        inner = getattr(obj, name)

        def run(*args: Any, **kwargs: Any) -> Any:
            phases.label = label() if callable(label) else label
            return inner(*args, **kwargs)

        setattr(obj, name, run)

    count = [0]

    def next_micro_batch() -> str:
        count[0] += 1
        return f"mb{count[0]}"

    labelled(trainer.policy, "generate", "generate")
    labelled(trainer.update, "_microbatch_backward", next_micro_batch)
    labelled(trainer.optimizer, "step", "optimizer")
    labelled(torch.nn.utils, "clip_grad_norm_", "clip")
    for i, layer in enumerate(decoder_layers(trainer.model)):
        layer.register_forward_pre_hook(lambda m, a, i=i: phases.within(f"f{i}"))
        layer.register_full_backward_pre_hook(lambda m, g, i=i: phases.within(f"b{i}"))
    return lambda: count.__setitem__(0, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, default=None, help="this file instead")
    add_result_args(parser, "vs_trl.py --dry's shape, one step, into a temporary folder")
    args = parser.parse_args()
    if args.dry:
        args.steps = 1
        vs_trl.apply_modes(argparse.Namespace(device="cpu", lora=False, trl_vllm=False,
                                              dry=True, no_gc=False))  # fmt: skip
    import torch

    from rldojo.config import load_config
    from rldojo.training.trainer import Trainer

    threads = 2
    torch.set_num_threads(threads)
    phases = Phases()
    steps = []
    with tempfile.TemporaryDirectory(prefix="memory_probe_") as tmp:
        overrides = vs_trl.rldojo_overrides(args.steps, threads, Path(tmp)) + args.set
        trainer = Trainer(load_config(None, overrides), Path(tmp) / "probe")
        restart_count = instrument(trainer, phases)
        for step in range(args.steps):
            restart_count()
            phases.peaks.clear()
            phases.label = "start"
            trainer.step()
            time.sleep(0.01)  # one more sample after the step
            peaks = {k: round(v) for k, v in phases.peaks.items()}
            top = sorted(peaks.items(), key=lambda kv: -kv[1])[:5]
            print(f"step {step + 1}: resident {vs_trl.rss_mib():.0f} MiB; highest: {top}")
            steps.append({"resident_after_mib": round(vs_trl.rss_mib()),
                          "peak_by_phase_mib": peaks})  # fmt: skip
        trainer.close()
    phases.stop()
    result = {
        "benchmark": "resident memory per phase of an rldojo step (vs_trl.py's settings)",
        "overrides": vs_trl.rldojo_overrides(args.steps, threads, Path("<tmp>")) + args.set,
        "machine": vs_trl.environment_info(threads),
        "rldojo_git": vs_trl.git_state(),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "steps": steps,
    }
    label = "dry" if args.dry else "default"
    path = write_result("memory_probe", label, result, out_dir=args.results, path=args.out,
                        dry=args.dry)  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
