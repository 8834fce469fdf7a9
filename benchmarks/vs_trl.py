"""rldojo vs TRL's `GRPOTrainer`: step time, peak memory and reward, side by side on CPU.

    python benchmarks/vs_trl.py [--steps N] [--device cpu|cuda] [--lora] [--trl-vllm]
    python benchmarks/vs_trl.py --dry --sides rldojo     # a smoke run of the machinery

GPU and LoRA: `--device cuda` puts both sides on the GPU (rldojo
`run.device=cuda`, bf16 autocast; TRL `use_cpu=False`, `bf16=True`) and records each
side's peak CUDA memory (`torch.cuda.max_memory_allocated`) beside its peak RSS;
`--trl-vllm` gives TRL its vLLM colocate mode; `--lora` trains LoRA adapters on both
sides (rldojo `model.lora`, TRL `peft_config`; r 16, alpha 32, attention and MLP
projections). `--dry` shrinks everything (tiny-random, 2x4 samples of 8 tokens, one
step) to check the machinery on any machine; `--sides rldojo` runs rldojo's side alone
(no TRL needed; no comparison).

runs both trainers on the same problem and writes
`benchmarks/results/vs_trl/<device>[_lora][_rldojo_only].json` (`results_io`; `--results
DIR` for another folder, `--out FILE` for one file; `--dry` into a temporary folder):

* same model: SmolLM2-135M-Instruct (rldojo's built-in; TRL loads `smollm2_dir()`, the
  same weights as safetensors), full fine-tuning, AdamW, lr 2e-5, betas (0.9, 0.99),
  constant schedule, grad clip 1.0, no KL (TRL `beta=0.0`);
* same task and reward: arith-v1 (level 1, "What is a + b?"), scored by rldojo's own
  `answer_reward` grader on both sides (TRL gets it as a reward function);
* same prompts in the same order: rldojo's trainer draws every step's tasks up front
  (its seeded order) and TRL gets them as an unshuffled dataset (checked from its side);
* same shape: 8 prompts x 8 samples per step, at most 48 new tokens, temperature 0.7,
  one optimizer step per 64 completions (TRL: `per_device_train_batch_size=8`,
  `gradient_accumulation_steps=8`, `num_iterations=1`), forward micro-batches of 8;
* forking tokens: top ρ = 0.2 of policy tokens by entropy carry gradient
  (rldojo `loss.rho=0.2`; TRL `top_entropy_quantile=0.2`), clip 0.2 / clip-higher 0.28.

What still differs is each library's own machinery, which is what this measures (the
JSON records every setting): rldojo samples with its cached decode loop and takes
entropies from the sampler; TRL samples with HF `generate` and recomputes entropies in its
training forward. TRL's loss is `loss_type="dapo"` (token-level, divided by all completion
tokens of the optimizer step; rldojo divides by the selected tokens; under Adam the scale
hardly matters) and its ρ threshold is taken per micro-batch of 8 (rldojo: over the whole
batch of 64). Both train with fp32 master weights in the precision this machine's probe
chooses (`rldojo.hardware.resolve_precision`: bf16 autocast where a bf16 matmul is fast,
fp32 on an AVX2-only CPU, where bf16 is ~30x slower; rldojo `model.*=auto`, TRL
`bf16=` the same choice, `use_cpu=True`); both checkpoint activations (TRL: its default
gradient checkpointing; rldojo: `optim.activation_checkpointing=true`, which keeps its
shared-prompt KV path);
`--no-gc` turns it off on both sides. Dynamic sampling is off in rldojo, since TRL does
not refill groups.

Each side runs in its own child process (this script with `--side`), so the peak
resident memory (VmHWM) of one is not polluted by the other. Both load first, then the
parent alternates their steps (rldojo, TRL; TRL, rldojo; ...) while the idle side blocks:
on a shared machine, load from other jobs comes and goes, and interleaving exposes both
sides to it alike. Step time is wall time per optimizer step (rldojo: around
`Trainer.step()`; TRL: a `TrainerCallback` from `on_step_begin` to `on_step_end`),
generation and grading included; the ratio uses the median step (the paired per-step
ratios are recorded too, with CPU seconds, the load average and a matmul probe before and
after each step, which flags the steps that other jobs slowed). Rewards are
per-step means over the 64 samples (failed grades excluded on both sides); step 1 samples
the untouched model on both sides, so its rewards differ only by sampler and noise.
Targets (from the issue): rldojo at most 0.7x TRL's step time and 0.8x its peak memory,
with no worse reward after N steps ("no worse" allows two standard errors of sampling
noise; the strict comparison is recorded too).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from machine_load import cpu_probe, load_average  # benchmarks/ is on sys.path
from results_io import results_dir, write_result

TIME_TARGET = 0.7
"""rldojo step time / TRL step time must be at most this (the issue's target)."""
MEMORY_TARGET = 0.8
"""rldojo peak RSS / TRL peak RSS must be at most this (the issue's target)."""
CLEAN_PROBE = 0.75
"""A step counts as uncontended when the CPU probe around it reaches this share of the best."""

SHARED = {
    "model": "smollm2-135m-instruct",
    "env": "arith-v1",
    "prompts_per_step": 8,
    "group_size": 8,
    "max_new_tokens": 48,
    "temperature": 0.7,
    "top_p": 1.0,
    "lr": 2e-5,
    "betas": (0.9, 0.99),
    "weight_decay": 0.0,
    "grad_clip": 1.0,
    "rho": 0.2,
    "eps_low": 0.2,
    "eps_high": 0.28,
    "kl_coef": 0.0,
    "micro_batch": 8,
    "seed": 0,
}
"""Settings both sides get (the JSON records how each library spells them)."""


# ----------------------------------------------------------------------- measuring


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (VmHWM), in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def children_peak_rss_mib() -> float:
    """Largest peak RSS among finished children (e.g. math-verify workers), in MiB."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def rss_mib() -> float:
    """Current resident set size of this process, in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def git_state() -> dict[str, Any]:
    """The rldojo commit measured, and which tracked files differ from it (read-only git)."""

    def git(*args: str) -> str:
        cmd = ["git", "-C", str(Path(__file__).resolve().parent), *args]
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()

    changed = git("status", "--porcelain", "--untracked-files=no", "--", "src")
    return {"commit": git("rev-parse", "HEAD"), "src_modified": changed.splitlines()}


def reward_summary(values: list[float]) -> dict[str, float]:
    """Mean, population std and standard error of the mean of one step's rewards."""
    n = len(values)
    mean = sum(values) / n if n else float("nan")
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / n) if n else float("nan")
    return {"mean": mean, "std": std, "sem": std / math.sqrt(n) if n else float("nan"), "n": n}


def environment_info(threads: int) -> dict[str, Any]:
    import importlib.metadata

    import torch
    import transformers

    try:  # rldojo's side alone (`--sides rldojo`, memory_probe.py) runs without TRL
        trl_version: str | None = importlib.metadata.version("trl")
    except importlib.metadata.PackageNotFoundError:
        trl_version = None
    cpu = platform.processor() or platform.machine()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "torch_threads": threads,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl_version,
    }


# ----------------------------------------------------------------------- rldojo side


LORA = {"r": 16, "alpha": 32, "dropout": 0.0,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                           "down_proj"]}  # fmt: skip
MODES = {"device": "cpu", "lora": False, "trl_vllm": False, "dry": False, "gc": True}
"""Set from the command line in the parent and in each child (`apply_modes`)."""


def apply_modes(args: argparse.Namespace) -> None:
    MODES.update(device=args.device, lora=args.lora, trl_vllm=args.trl_vllm, dry=args.dry,
                 gc=not args.no_gc)  # fmt: skip
    if args.dry:  # the machinery on a model that loads in a second
        SHARED.update(model="tiny-random", prompts_per_step=2, group_size=4, max_new_tokens=8,
                      micro_batch=4)  # fmt: skip


def cuda_peak_mib() -> float | None:
    """Peak CUDA memory allocated by this process (None off the GPU)."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda.max_memory_allocated() / 2**20


def machine_bf16() -> bool:
    """Whether this machine trains under bf16 autocast: rldojo's own choice
    (`model.autocast_bf16 = "auto"`, the matmul probe), which TRL's side is given too."""
    from rldojo.hardware.precision import resolve_precision

    return resolve_precision("auto", "auto", device=MODES["device"]).autocast_bf16


def rldojo_overrides(steps: int, threads: int, run_dir: Path) -> list[str]:
    s = SHARED
    extra = [f"run.device={MODES['device']}", "run.report_to=[]",
             f"optim.activation_checkpointing={str(MODES['gc']).lower()}"]  # fmt: skip
    if MODES["lora"]:
        targets = ", ".join(f"'{m}'" for m in LORA["target_modules"])
        extra.append(f"model.lora={{r = {LORA['r']}, alpha = {LORA['alpha']}, "
                     f"target_modules = [{targets}]}}")  # fmt: skip
    return [
        *extra,
        f"model.name={s['model']}",
        f"env.id={s['env']}",
        f"rollout.prompts_per_step={s['prompts_per_step']}",
        f"rollout.group_size={s['group_size']}",
        "rollout.dynamic_sampling=false",
        f"sampling.max_new_tokens={s['max_new_tokens']}",
        f"sampling.temperature={s['temperature']}",
        f"sampling.top_p={s['top_p']}",
        f"optim.lr={s['lr']}",
        f"optim.betas=[{s['betas'][0]}, {s['betas'][1]}]",
        f"optim.weight_decay={s['weight_decay']}",
        f"optim.grad_clip={s['grad_clip']}",
        f"optim.micro_batch_size={s['micro_batch']}",
        "optim.schedule=constant",
        f"loss.rho={s['rho']}",
        f"loss.eps_low={s['eps_low']}",
        f"loss.eps_high={s['eps_high']}",
        f"loss.kl_coef={s['kl_coef']}",
        "eval.tasks=0",
        f"run.steps={steps}",
        f"run.seed={s['seed']}",
        f"run.threads={threads}",
        f"run.output_dir={run_dir}",
        "run.name=vs_trl",
    ]


def run_rldojo(steps: int, threads: int, io_dir: Path) -> dict[str, Any]:
    """Train `steps` steps with rldojo's `Trainer`; record times, rewards, memory, prompts.

    The trainer's own task sampler (`trainer.experience.tasks.draw`) draws every step's prompts up
    front (its order is seeded and does not depend on training, so drawing early changes
    nothing); they are written to `io_dir/task_ids.json` for TRL and handed back to the
    trainer step by step.
    """
    import torch

    from rldojo.config import load_config
    from rldojo.training.trainer import Trainer

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory(prefix="vs_trl_rldojo_") as tmp:
        cfg = load_config(None, rldojo_overrides(steps, threads, Path(tmp)))
        trainer = Trainer(cfg, Path(tmp) / "vs_trl")
        n = SHARED["prompts_per_step"]
        planned = [trainer.experience.tasks.draw(n) for _ in range(steps)]
        (io_dir / "task_ids.json").write_text(json.dumps([[t.id for t in p] for p in planned]))
        drawn: list[list[str]] = []

        def next_planned(k: int) -> list[Any]:  # the draws made above, one step at a time
            if k != n or len(drawn) == len(planned):
                raise RuntimeError(f"vs_trl: unplanned draw of {k} tasks (dynamic sampling on?)")
            drawn.append([t.id for t in planned[len(drawn)]])
            return planned[len(drawn) - 1]

        trainer.experience.tasks.draw = next_planned  # type: ignore[method-assign]
        if MODES["dry"]:  # TRL loads a directory: the same tiny weights
            save_plain_model(trainer.model, trainer.tokenizer, io_dir / "tiny_model")
        before = {"rss_mib": rss_mib(), "peak_rss_mib": peak_rss_mib()}
        steps_out = []
        tell_parent("ready")
        for _ in range(steps):
            wait_for_parent()
            probe = cpu_probe()
            t0, c0 = time.perf_counter(), time.process_time()
            m = trainer.step()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            steps_out.append(
                {
                    "time_s": wall,
                    "cpu_s": cpu,
                    "probe_gflops": [probe, cpu_probe()],
                    "load_avg_1m": load_average(),
                    "time_generate_s": m.get("time/generate"),
                    "time_grade_s": m.get("time/grade"),
                    "time_train_s": m.get("time/train"),
                    "reward_mean": m["reward/mean"],
                    "reward_std": m["reward/std"],
                    "pass_rate": m["reward/pass_rate"],
                    "completion_len": m["rollout/completion_len"],
                    "samples": m["rollout/samples"],
                    "tokens_selected": m.get("entropy/tokens_selected"),
                    "tokens_policy": m.get("entropy/tokens_policy"),
                    "grad_norm": m.get("optim/grad_norm"),
                    "clip_frac": m.get("loss/clip_frac"),
                    "rss_mib": rss_mib(),
                    "peak_rss_so_far_mib": peak_rss_mib(),
                    "examples": trainer.ledger.samples(len(steps_out), limit=3),
                }
            )
            print(f"step {len(steps_out)}: {wall:.1f}s, reward {m['reward/mean']:.3f}", flush=True)
            if len(steps_out) < steps:  # the last one is reported once the results are written
                tell_parent("stepped")
        trainer.close()
        settings = {"overrides": rldojo_overrides(steps, threads, Path("<tmp>"))}
        settings |= _rldojo_notes(threads)
    return {
        "settings": settings,
        "before_training": before,
        "steps": steps_out,
        "task_ids": drawn,
    }


def save_plain_model(model: Any, tokenizer: Any, out: Path) -> None:
    """Write `model` as a plain transformers directory (config.json with its model_type,
    full weights, tokenizer) that TRL loads by path and wraps with its own `peft_config`.

    Under `--lora` rldojo's model is a peft model, whose `save_pretrained` writes the
    adapter alone (no config.json); its adapters are fresh (B = 0) before the first step,
    so a merged copy holds exactly the base weights. The live model is left as it is.
    """
    from rldojo.policy.lora import is_peft_model, merged_copy

    plain = merged_copy(model) if is_peft_model(model) else model
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _rldojo_notes(threads: int) -> dict[str, Any]:
    return {
        "generation": "rldojo cached decode loop (sampling.py), precision per model.*=auto",
        "device": MODES["device"],
        "lora": LORA if MODES["lora"] else None,
        "training_precision": "fp32 master weights, "
        + ("bf16 autocast" if machine_bf16() else "fp32")
        + " (model.autocast_bf16=auto, this machine's probe)",
        "gradient_checkpointing": MODES["gc"],
        "loss": "clipped surrogate, clip-higher, sum over selected tokens / #selected tokens",
        "rho_scope": "batch (top 20% of the 64 sequences' policy tokens)",
        "entropy_source": "sampler (its decode loop, at the sampling temperature)",
        "advantages": "group mean/std (population std)",
        "optimizer": "torch.optim.AdamW, lr 2e-5, betas (0.9, 0.99), no weight decay",
        "torch_threads": threads,
    }


# ----------------------------------------------------------------------- TRL side


class GraderReward:
    """TRL reward function that scores completions with rldojo's grader for the task.

    Runs the same `grade_rollouts` path as rldojo's trainer, so both sides get identical
    rewards for identical text. A failed grade is None (TRL turns it into NaN and leaves
    it out), as rldojo leaves failed grades out. Records each call (= one step's 64).
    """

    def __init__(self, env: Any, tasks: dict[str, Any]) -> None:
        self.__name__ = "rldojo_answer_reward"  # TRL names reward functions by __name__
        self.grader = env.default_grader()
        self.tasks = tasks
        self.loop = asyncio.new_event_loop()
        self.calls: list[dict[str, Any]] = []

    def __call__(self, prompts: list, completions: list, task_id: list[str], **_: Any) -> list:
        from rldojo.rollout.episodes import grade_rollouts
        from rldojo.types import Rollout

        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        tasks = [self.tasks[i] for i in task_id]
        rollouts = [
            Rollout(task_id=t.id, env=t.env, messages=[], completion=x)
            for t, x in zip(tasks, texts, strict=True)
        ]
        t0 = time.perf_counter()
        scores = self.loop.run_until_complete(grade_rollouts(self.grader, rollouts, tasks))
        values = [s.value if s.ok else None for s in scores]
        self.calls.append(
            {
                "task_ids": list(dict.fromkeys(task_id)),
                "rewards": [v for v in values if v is not None],
                "passed": sum(s.components.get("correct", 0.0) >= 1.0 for s in scores if s.ok),
                "failed_grades": sum(v is None for v in values),
                "time_grade_s": time.perf_counter() - t0,
                "examples": [
                    {"task_id": i, "completion": x, "reward": v}
                    for i, x, v in list(zip(task_id, texts, values, strict=True))[:3]
                ],
            }
        )
        return values

    def close(self) -> None:
        close = getattr(self.grader, "close", None)
        if close is not None:
            result = close()
            if asyncio.iscoroutine(result):
                self.loop.run_until_complete(result)
        self.loop.close()


def trl_config(steps: int, output_dir: str, gradient_checkpointing: bool) -> Any:
    from trl import GRPOConfig

    s = SHARED
    vllm = {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3}
    return GRPOConfig(
        **(vllm if MODES["trl_vllm"] else {}),
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=s["micro_batch"],
        gradient_accumulation_steps=s["prompts_per_step"] * s["group_size"] // s["micro_batch"],
        num_generations=s["group_size"],
        num_iterations=1,
        max_completion_length=s["max_new_tokens"],
        temperature=s["temperature"],
        top_p=s["top_p"],
        top_k=0,
        learning_rate=s["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=s["betas"][0],
        adam_beta2=s["betas"][1],
        weight_decay=s["weight_decay"],
        max_grad_norm=s["grad_clip"],
        beta=s["kl_coef"],
        epsilon=s["eps_low"],
        epsilon_high=s["eps_high"],
        loss_type="dapo",
        scale_rewards="group",
        top_entropy_quantile=s["rho"],
        mask_truncated_completions=False,
        use_cpu=MODES["device"] == "cpu",  # with bf16=True: bf16 autocast on CPU too
        bf16=machine_bf16(),  # the precision rldojo's side resolves on this machine
        gradient_checkpointing=gradient_checkpointing,
        shuffle_dataset=False,  # replay rldojo's prompt order exactly
        seed=s["seed"],
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def _step_timer(records: list[dict[str, Any]], threads_seen: list[int]) -> Any:
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        """Wall time of each optimizer step (generation + 8 micro-batches + AdamW).

        Each step starts when the parent says so. The parent hears that the previous step
        is over (or, the first time, that TRL is ready) only here, when TRL is about to
        block, so that TRL's logging after a step does not overlap rldojo's next step.
        """

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            import torch

            tell_parent("stepped" if records else "ready")
            wait_for_parent()
            threads_seen.append(torch.get_num_threads())
            probe = cpu_probe()
            records.append({"t0": time.perf_counter(), "c0": time.process_time(), "probe": probe})

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            records[-1]["time_s"] = time.perf_counter() - records[-1].pop("t0")
            records[-1]["cpu_s"] = time.process_time() - records[-1].pop("c0")
            records[-1]["probe_gflops"] = [records[-1].pop("probe"), cpu_probe()]
            records[-1]["load_avg_1m"] = load_average()
            records[-1]["rss_mib"] = rss_mib()
            records[-1]["peak_rss_so_far_mib"] = peak_rss_mib()
            print(f"step {len(records)}: {records[-1]['time_s']:.1f}s", flush=True)

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if records and logs and "reward" in logs:
                records[-1]["trl_log"] = {k: v for k, v in logs.items() if _is_number(v)}

    return StepTimer()


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _time_generation(trainer: Any, records: list[dict[str, Any]]) -> None:
    """Time TRL's generate call (instance-level wrapper; behaviour unchanged).

    `_generate_single_turn` is TRL-internal (1.16); without it the breakdown is skipped.
    """
    generate = getattr(trainer, "_generate_single_turn", None)
    if generate is None:
        return

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = generate(*args, **kwargs)
        if records:
            records[-1]["time_generate_s"] = time.perf_counter() - t0
        return out

    trainer._generate_single_turn = timed


def run_trl(
    steps: int, threads: int, task_ids: list[list[str]], gc: bool, io_dir: Path
) -> dict[str, Any]:
    """Train `steps` steps with TRL's `GRPOTrainer` on rldojo's prompts, in rldojo's order."""
    import torch
    from datasets import Dataset
    from trl import GRPOTrainer

    from rldojo.envs.registry import make_env
    from rldojo.policy.models import smollm2_dir

    torch.set_num_threads(threads)
    env = make_env(SHARED["env"])
    by_id = {t.id: t for t in env.tasks("train", seed=SHARED["seed"])}
    order = [by_id[i] for step in task_ids for i in step]
    rows = [{"prompt": env.prompt_messages(t), "task_id": t.id, "answer": t.answer} for t in order]
    reward = GraderReward(env, by_id)
    records: list[dict[str, Any]] = []
    threads_seen: list[int] = []
    peft_config = None
    if MODES["lora"]:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=LORA["r"], lora_alpha=LORA["alpha"], lora_dropout=0.0,
            target_modules=LORA["target_modules"], task_type="CAUSAL_LM",
        )  # fmt: skip
    model = str(io_dir / "tiny_model") if MODES["dry"] else str(smollm2_dir())
    with tempfile.TemporaryDirectory(prefix="vs_trl_trl_") as tmp:
        trainer = GRPOTrainer(
            model=model,
            peft_config=peft_config,
            reward_funcs=reward,
            args=trl_config(steps, tmp, gc),
            train_dataset=Dataset.from_list(rows),
            callbacks=[_step_timer(records, threads_seen)],
        )
        _time_generation(trainer, records)
        model_dtype = str(next(trainer.model.parameters()).dtype)
        before = {"rss_mib": rss_mib(), "peak_rss_mib": peak_rss_mib()}  # model loaded
        trainer.train()
        args = trainer.args
    reward.close()
    steps_out = [_trl_step(rec, call) for rec, call in zip(records, reward.calls, strict=True)]
    settings = _trl_settings(args, model_dtype, threads_seen)
    return {
        "settings": settings,
        "before_training": before,
        "steps": steps_out,
        "task_ids": [c["task_ids"] for c in reward.calls],
    }


def _trl_step(record: dict[str, Any], call: dict[str, Any]) -> dict[str, Any]:
    log = record.get("trl_log", {})
    summary = reward_summary(call["rewards"])
    return {
        "time_s": record["time_s"],
        "cpu_s": record["cpu_s"],
        "probe_gflops": record["probe_gflops"],
        "load_avg_1m": record["load_avg_1m"],
        "time_generate_s": record.get("time_generate_s"),
        "time_grade_s": call["time_grade_s"],
        "reward_mean": summary["mean"],
        "reward_std": summary["std"],
        "pass_rate": call["passed"] / max(len(call["rewards"]), 1),
        "completion_len": log.get("completions/mean_length"),
        "samples": len(call["rewards"]) + call["failed_grades"],
        "failed_grades": call["failed_grades"],
        "grad_norm": log.get("grad_norm"),
        "clip_frac": log.get("clip_ratio/region_mean"),
        "rss_mib": record.get("rss_mib"),
        "peak_rss_so_far_mib": record.get("peak_rss_so_far_mib"),
        "examples": call["examples"],
        "trl_log": log,
    }


def _trl_settings(args: Any, model_dtype: str, threads_seen: list[int]) -> dict[str, Any]:
    keys = (
        "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations",
        "generation_batch_size", "steps_per_generation", "num_iterations",
        "max_completion_length", "temperature", "top_p", "top_k", "learning_rate",
        "lr_scheduler_type", "adam_beta1", "adam_beta2", "weight_decay", "max_grad_norm",
        "optim", "beta", "epsilon", "epsilon_high", "loss_type", "scale_rewards",
        "top_entropy_quantile", "mask_truncated_completions", "use_cpu", "bf16",
        "gradient_checkpointing", "shuffle_dataset", "seed", "use_vllm",
    )  # fmt: skip
    settings = {k: _jsonable(getattr(args, k, None)) for k in keys}
    return settings | {
        "model_dtype": model_dtype,
        "generation": "HF generate on the fp32 model (under bf16 autocast where it trains so)",
        "training_precision": "fp32 master weights, "
        + ("bf16 autocast (accelerate mixed precision)" if machine_bf16() else "fp32")
        + " (bf16= rldojo's probe choice on this machine)",
        "rho_scope": "micro-batch of 8 (torch.quantile per forward), as TRL implements it",
        "entropy_source": "training forward (in its training precision)",
        "advantages": "group mean/std (TRL's std)",
        "torch_threads_seen": sorted(set(threads_seen)),
    }


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


# ----------------------------------------------------------------------- comparison


def summarise(side: dict[str, Any]) -> dict[str, Any]:
    steps = side["steps"]
    rewards = [s["reward_mean"] for s in steps]
    last = steps[-1]
    return {
        "step_time_median_s": statistics.median(s["time_s"] for s in steps),
        "step_time_mean_s": statistics.fmean(s["time_s"] for s in steps),
        "step_cpu_median_s": statistics.median(s["cpu_s"] for s in steps),
        "peak_rss_mib": side["peak_rss_mib"],
        "cuda_peak_mib": side.get("cuda_peak_mib"),
        "reward_last_step": last["reward_mean"],
        "reward_last_step_sem": last["reward_std"] / math.sqrt(max(last["samples"], 1)),
        "reward_mean_all_steps": statistics.fmean(rewards),
        "reward_first_step": rewards[0],
    }


def compare(ours: dict[str, Any], trl: dict[str, Any]) -> dict[str, Any]:
    a, b = summarise(ours), summarise(trl)
    time_ratio = a["step_time_median_s"] / b["step_time_median_s"]
    mem_ratio = a["peak_rss_mib"] / b["peak_rss_mib"]
    gap = a["reward_last_step"] - b["reward_last_step"]
    noise = 2 * math.hypot(a["reward_last_step_sem"], b["reward_last_step_sem"])
    paired = [x["time_s"] / y["time_s"] for x, y in zip(ours["steps"], trl["steps"], strict=True)]
    clean = clean_pairs(ours["steps"], trl["steps"])
    return {
        "rldojo": a,
        "trl": b,
        "step_time_ratio": time_ratio,
        "step_time_ratio_per_step": paired,
        "step_time_ratio_median_of_pairs": statistics.median(paired),
        "clean_pairs": clean,
        "step_time_ratio_clean_pairs": statistics.median(paired[k] for k in clean)
        if clean
        else None,
        "machine_contended": len(clean) < len(paired),
        "step_cpu_ratio": a["step_cpu_median_s"] / b["step_cpu_median_s"],
        "peak_rss_ratio": mem_ratio,
        "cuda_peak_ratio": a["cuda_peak_mib"] / b["cuda_peak_mib"]
        if a["cuda_peak_mib"] and b["cuda_peak_mib"]
        else None,
        "reward_last_step_diff": gap,
        "reward_noise_2sem": noise,
        "targets": {
            "step_time_ratio_max": TIME_TARGET,
            "peak_rss_ratio_max": MEMORY_TARGET,
            "step_time_met": time_ratio <= TIME_TARGET,
            "peak_rss_met": mem_ratio <= MEMORY_TARGET,
            "reward_no_worse_met": gap >= -noise,
            "reward_no_worse_strict": gap >= 0,
        },
    }


def clean_pairs(ours: list[dict[str, Any]], trl: list[dict[str, Any]]) -> list[int]:
    """Steps where neither side's CPU probe (before and after the step) fell below
    `CLEAN_PROBE` of the best probe of the run: other jobs were probably not running."""
    best = max(g for step in (*ours, *trl) for g in step["probe_gflops"])
    ok = [
        min(a["probe_gflops"] + b["probe_gflops"]) >= CLEAN_PROBE * best
        for a, b in zip(ours, trl, strict=True)
    ]
    return [k for k, good in enumerate(ok) if good]


def print_table(result: dict[str, Any]) -> None:
    c = result["comparison"]
    a, b, t = c["rldojo"], c["trl"], c["targets"]
    rows = [
        ("median step time (s)", a["step_time_median_s"], b["step_time_median_s"],
         f"{c['step_time_ratio']:.2f}x (target <= {TIME_TARGET}: {_ok(t['step_time_met'])})"),
        ("median step CPU (s)", a["step_cpu_median_s"], b["step_cpu_median_s"],
         f"{c['step_cpu_ratio']:.2f}x (CPU seconds used by the process)"),
        ("peak RSS (MiB)", a["peak_rss_mib"], b["peak_rss_mib"],
         f"{c['peak_rss_ratio']:.2f}x (target <= {MEMORY_TARGET}: {_ok(t['peak_rss_met'])})"),
        ("reward, step 1", a["reward_first_step"], b["reward_first_step"], ""),
        (f"reward, step {result['steps']}", a["reward_last_step"], b["reward_last_step"],
         f"diff {c['reward_last_step_diff']:+.3f} +- {c['reward_noise_2sem']:.3f} "
         f"(no worse: {_ok(t['reward_no_worse_met'])})"),
        ("reward, mean of steps", a["reward_mean_all_steps"], b["reward_mean_all_steps"], ""),
    ]  # fmt: skip
    print(f"\n{'':24}{'rldojo':>10}{'TRL':>10}  rldojo / TRL")
    for name, x, y, note in rows:
        print(f"{name:24}{x:>10.3f}{y:>10.3f}  {note}")
    if c["machine_contended"]:
        clean = c["step_time_ratio_clean_pairs"]
        busy = len(c["step_time_ratio_per_step"]) - len(c["clean_pairs"])
        print(
            f"\nwarning: other jobs slowed {busy} step pair(s) (CPU probe); "
            "step time ratio over clean pairs: "
            + (f"{clean:.2f}x" if clean is not None else "none clean")
        )


def _ok(flag: bool) -> str:
    return "met" if flag else "NOT met"


# ----------------------------------------------------------------------- processes

CONTROL = "@@vs_trl "
"""Prefix of the children's stdout lines that talk to the parent (the rest is echoed)."""


def tell_parent(word: str) -> None:
    print(CONTROL + word, flush=True)


def wait_for_parent() -> None:
    """Block until the parent sends `step` (EOF: the parent is gone, so stop)."""
    if sys.stdin.readline().strip() != "step":
        raise SystemExit("vs_trl child: the parent went away")


def child_env() -> dict[str, str]:
    return os.environ | {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "WANDB_DISABLED": "true",
        "PYTHONUNBUFFERED": "1",
    }


class Side:
    """One side in its own interpreter (this script with `--side`), driven step by step.

    The child loads everything, says `ready`, then runs one optimizer step per `step`
    line on its stdin and answers `stepped` once it is idle again (after the last step:
    once its results are written); in between it blocks and uses no CPU.
    """

    def __init__(self, side: str, args: argparse.Namespace, io_dir: Path) -> None:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--side", side]
        cmd += ["--io-dir", str(io_dir), "--steps", str(args.steps), "--threads", str(args.threads)]
        cmd += ["--no-gc"] if args.no_gc else []
        cmd += ["--device", args.device] + ["--lora"] * args.lora + ["--dry"] * args.dry
        cmd += ["--trl-vllm"] * args.trl_vllm
        self.name, self.io_dir = side, io_dir
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env()
        )
        self.expect("ready")

    def expect(self, word: str) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(CONTROL):
                if line[len(CONTROL) :].strip() != word:
                    raise SystemExit(f"vs_trl: {self.name} said {line.strip()!r}, not {word!r}")
                return
            print(f"[{self.name}] {line}", end="")
        raise SystemExit(f"vs_trl: {self.name} exited (code {self.proc.wait()}) before {word!r}")

    def step(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        self.expect("stepped")

    def finish(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        for line in self.proc.stdout:
            print(f"[{self.name}] {line}", end="")
        if self.proc.wait():
            raise SystemExit(f"vs_trl: {self.name} failed (exit code {self.proc.returncode})")
        return json.loads((self.io_dir / f"{self.name}.json").read_text())


def run_sides(args: argparse.Namespace, io_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Start both sides, then alternate their steps: A B, B A, A B, ...

    On a shared machine, load from other jobs comes and goes over minutes; interleaving
    the two sides step by step (and swapping who goes first) exposes both to the same
    conditions, which running one side after the other does not.
    """
    ours = Side("rldojo", args, io_dir)  # first: it writes the prompt order TRL replays
    if args.sides == "rldojo":  # rldojo alone (a smoke run, or no TRL installed)
        for _ in range(args.steps):
            ours.step()
        return ours.finish(), {}
    trl = Side("trl", args, io_dir)
    results = {}
    for k in range(args.steps):
        for side in (ours, trl) if k % 2 == 0 else (trl, ours):
            side.step()
            if k == args.steps - 1:  # let it exit before the other side's last step
                results[side.name] = side.finish()
    return results["rldojo"], results["trl"]


def child_main(args: argparse.Namespace) -> None:
    io_dir = Path(args.io_dir)
    if args.side == "rldojo":
        result = run_rldojo(args.steps, args.threads, io_dir)
    else:
        task_ids = json.loads((io_dir / "task_ids.json").read_text())
        result = run_trl(args.steps, args.threads, task_ids, not args.no_gc, io_dir)
    result["peak_rss_mib"] = peak_rss_mib()
    result["cuda_peak_mib"] = cuda_peak_mib()
    result["children_peak_rss_mib"] = children_peak_rss_mib()
    (io_dir / f"{args.side}.json").write_text(json.dumps(result))
    tell_parent("stepped")  # the last step, now that nothing more runs here


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="optimizer steps per side")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                        help="torch intra-op threads, both sides")  # fmt: skip
    parser.add_argument("--no-gc", action="store_true",
                        help="no activation checkpointing on either side (TRL's default "
                        "gradient checkpointing off, rldojo's left off)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="this file instead")
    parser.add_argument("--results", type=Path, default=None,
                        help="folder of the results (default: $RLDOJO_RESULTS_DIR, else "
                        "benchmarks/results; with --dry a new temporary folder)")  # fmt: skip
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where both sides train (and generate)")  # fmt: skip
    parser.add_argument("--lora", action="store_true", help="LoRA adapters on both sides")
    parser.add_argument("--trl-vllm", action="store_true", help="TRL generates with vLLM "
                        "(colocate mode; needs vllm and --device cuda)")  # fmt: skip
    parser.add_argument("--dry", action="store_true", help="tiny model, one small step")
    parser.add_argument("--sides", choices=["both", "rldojo"], default="both")
    parser.add_argument("--side", choices=["rldojo", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--io-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.steps < 1 or args.threads < 1:
        parser.error("--steps and --threads must be at least 1")
    apply_modes(args)
    if args.side:
        child_main(args)
        return
    with tempfile.TemporaryDirectory(prefix="vs_trl_") as tmp:
        ours, trl = run_sides(args, Path(tmp))
    if not trl:
        write_rldojo_only(args, ours)
        return
    if ours["task_ids"] != trl["task_ids"]:
        raise SystemExit("vs_trl: TRL did not see rldojo's prompts in rldojo's order")
    result = {
        "benchmark": "rldojo vs TRL GRPOTrainer (top_entropy_quantile=0.2), " + MODES["device"],
        "modes": MODES,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "steps": args.steps,
        "schedule": "both sides loaded, steps interleaved rldojo/TRL, TRL/rldojo, ...",
        "machine": environment_info(args.threads),
        "rldojo_git": git_state(),
        "shared_settings": SHARED,
        "rldojo": ours,
        "trl": trl,
        "prompts_identical": True,
        "comparison": compare(ours, trl),
    }
    path = _write(args, result)
    print_table(result)
    print(f"\nwrote {path}")


def _write(args: argparse.Namespace, result: dict[str, Any]) -> Path:
    label = args.device + "_lora" * args.lora + "_rldojo_only" * (args.sides == "rldojo")
    if args.out is None:  # resolved here so that a dry run's folder is made only once
        args.results = results_dir(args.results, dry=args.dry)
    return write_result("vs_trl", label, result, out_dir=args.results, path=args.out,
                        dry=args.dry)  # fmt: skip


def write_rldojo_only(args: argparse.Namespace, ours: dict[str, Any]) -> None:
    """`--sides rldojo`: rldojo's figures alone (no TRL, so no ratios)."""
    result = {
        "benchmark": "vs_trl, rldojo side only (--sides rldojo)", "modes": MODES,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "steps": args.steps,
        "shared_settings": SHARED, "rldojo_git": git_state(), "rldojo": ours,
        "summary": summarise(ours),
    }  # fmt: skip
    path = _write(args, result)
    print(json.dumps(result["summary"], indent=2))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
