"""Bytes per GPU of sharded training (FSDP2), computed from each model's architecture.

    .venv/bin/python benchmarks/capacity.py [--precision bf16|autocast] [--micro-batch 4]
        [--seq 2048] [--lora-r 16] [--logit-share 1.0] [--measure] [--results DIR] [--dry]

Computed, not measured: no model is trained and no GPU is used; the result says so
(`"kind": "computed"`). For each model below, for full fine-tuning and for LoRA, with and
without activation checkpointing, at world sizes 1-64, it writes the bytes one rank
holds at the peak of a step (the start of the backward pass) and the largest model of
the list that fits one 80 GiB GPU, to
`benchmarks/results/capacity/b<micro-batch>_s<seq>_<precision>.json` through `results_io`.

The models (`MODELS`) are written from their published config.json files (SmolLM2-135M's
also checked against the copy rldojo caches, ~/.cache/rldojo/models/smollm2-135m-instruct).
All are Llama-style decoders: GQA attention, SwiGLU MLP, RMSNorm; Qwen2.5 has biases on
its q, k and v projections.

What a rank holds under FSDP2 full sharding (ZeRO-3-like: `fully_shard` on every decoder
layer, then on the model, whose own unit, the root, holds the embedding, final norm and
output layer, one weight when tied; as `rldojo.training.distributed.shard_model` does):

- sharded, for the whole run: the fp32 master parameters (4 B/param / N), their fp32
  gradients (4 B / N) and AdamW's two fp32 moments (8 B / N). No full copy persists.
- gathered, transient: the root unit's parameters for the whole step (FSDP2 does not
  reshard the root after the forward) and `GATHERED_LAYERS` decoder layers (the one
  computing and the one FSDP2 prefetches); in the backward their unsharded gradients
  too, the root's from the output layer's backward until its reduce-scatter at the end.
- activations of one micro-batch of `--micro-batch` x `--seq` tokens (`layer_activation_bytes`,
  `checkpointed_layer_bytes`), plus the output layer's fp32 log-probs and their gradient
  (`logit_bytes`).
- LoRA (rldojo's `[model] lora`, default targets: q, k, v, o, gate, up and down
  projections of every layer, peft with dropout 0): the frozen base is sharded in fp32
  (rldojo loads models in fp32; a bf16 base would halve that term) and has no gradients
  or optimizer state; the adapters have all three, sharded; their `x @ A` (r wide) adds to
  the activations.

`--precision` (`PRECISIONS`) picks where the bf16 compute copy comes from:
`bf16`, FSDP2's `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`: units are
gathered in bf16 and their unsharded gradients are bf16; `autocast`, what `shard_model`
does today (no mixed-precision policy, bf16 autocast as on one GPU): units are gathered
in fp32, and autocast's bf16 cast of every weight matrix a layer used stays saved for
the backward, so without checkpointing a bf16 copy of the whole model sits on every
rank, unsharded; its residual stream and norms are fp32 and each projection casts its
input itself.

Not counted: the CUDA context, NCCL buffers, the allocator's fragmentation and AdamW's
temporaries (the headroom, `HEADROOM` of the GPU, is for those), a KL reference model
(`loss.kl_coef = 0` by default) and the generation copy or a colocated vLLM (generation on
Ray workers with GPUs of their own: docs/gpu.md; otherwise subtract its share).

`--measure` loads SmolLM2-135M-Instruct through rldojo and checks, on this CPU, its
parameter count and the bytes autograd saves for one decoder layer under both precisions
against the formulas. `--dry`: the same tables (milliseconds) without `--measure`, into a
temporary folder.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from typing import Any

from results_io import add_result_args, write_result

GIB = 2**30
GPU_GIB = 80  # an 80 GB A100/H100: torch sees ~79.2 GiB of it
HEADROOM = 0.9  # share of the GPU the estimate may fill; the rest for what is not counted
WORLD_SIZES = (1, 2, 4, 8, 16, 32, 64)
GATHERED_LAYERS = 2  # the decoder layer computing and the one FSDP2 prefetches
LORA_TARGETS = 7  # q, k, v, o, gate, up, down (`LoraSection.target_modules`' default)
# Checked on the real model: `load_model("smollm2-135m-instruct")` (transformers 5.25,
# fp32, tied embeddings) sums its `parameters()` to this; `--measure` repeats the check.
SMOLLM2_135M_PARAMS = 134_515_008


@dataclass(frozen=True)
class Precision:
    """Where the bf16 compute copy comes from (see the module docstring)."""

    name: str
    gathered_bytes: int  # per parameter of a gathered unit, and per unsharded gradient
    autocast: bool  # bf16 weight casts kept for the backward; fp32 residual stream


PRECISIONS = {"bf16": Precision("bf16", 2, autocast=False),
              "autocast": Precision("autocast", 4, autocast=True)}  # fmt: skip


@dataclass(frozen=True)
class Arch:
    """A decoder's shape, as its config.json names it (in comments)."""

    name: str
    hidden: int  # hidden_size
    layers: int  # num_hidden_layers
    heads: int  # num_attention_heads
    kv_heads: int  # num_key_value_heads
    intermediate: int  # intermediate_size
    vocab: int  # vocab_size
    tied: bool  # tie_word_embeddings
    qkv_bias: bool  # Qwen2: biases on q_proj, k_proj, v_proj

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim


MODELS = (  # smallest first: "the largest that fits" is the last that does
    Arch("SmolLM2-135M", 576, 30, 9, 3, 1536, 49152, tied=True, qkv_bias=False),
    Arch("Qwen2.5-0.5B", 896, 24, 14, 2, 4864, 151936, tied=True, qkv_bias=True),
    Arch("Qwen2.5-1.5B", 1536, 28, 12, 2, 8960, 151936, tied=True, qkv_bias=True),
    Arch("Qwen2.5-7B", 3584, 28, 28, 4, 18944, 152064, tied=False, qkv_bias=True),
    Arch("Qwen2.5-14B", 5120, 48, 40, 8, 13824, 152064, tied=False, qkv_bias=True),
)


# -- parameters -------------------------------------------------------------------------


def layer_matrices(a: Arch) -> int:
    """The weight matrices of one decoder layer: q, k, v, o, gate, up, down."""
    return 2 * a.hidden * a.hidden + 2 * a.hidden * a.kv_dim + 3 * a.hidden * a.intermediate


def layer_params(a: Arch) -> int:
    """One decoder layer: its matrices, the q/k/v biases if any, two RMSNorm weights."""
    bias = (a.hidden + 2 * a.kv_dim) if a.qkv_bias else 0
    return layer_matrices(a) + bias + 2 * a.hidden


def root_params(a: Arch) -> int:
    """The root unit: the embedding, the final norm, and the output layer unless tied."""
    return a.vocab * a.hidden * (1 if a.tied else 2) + a.hidden


def param_count(a: Arch) -> int:
    return root_params(a) + a.layers * layer_params(a)


def lora_layer_params(a: Arch, r: int) -> int:
    """Adapters of one layer: r x (in + out) for each of the seven projections."""
    ins_outs = [(a.hidden, a.hidden), (a.hidden, a.kv_dim), (a.hidden, a.kv_dim),
                (a.hidden, a.hidden), (a.hidden, a.intermediate),
                (a.hidden, a.intermediate), (a.intermediate, a.hidden)]  # fmt: skip
    return r * sum(i + o for i, o in ins_outs)


# -- activations ------------------------------------------------------------------------


def layer_activation_bytes(a: Arch, tokens: int, p: Precision, lora_r: int = 0) -> int:
    """What autograd keeps of one decoder layer for `tokens` tokens (weights aside).

    Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
    Models", sec. 4.1: 34sbh + 5as²b bytes per layer for GPT with 16-bit activations),
    adapted: no dropout masks; fused attention (SDPA / flash: no s² term, it keeps q, k,
    v, its output and the fp32 log-sum-exp per head); GQA (k and v kv_dim wide); SwiGLU
    (gate, up, silu(gate) and their product, intermediate wide); transformers' RMSNorm
    keeps its fp32 input and the normalised input (bf16; fp32 under autocast, whose
    residual stream is fp32). Under autocast each projection casts its input to bf16
    itself (q, k, v, gate, up: five copies; with LoRA five more for the A matrices). In
    bytes per token, bf16: 20h + 4·kv_dim + 8·I + 4·heads; autocast: 30h + ... (+ 2r per
    LoRA projection for `x @ A`). `--measure` checks both on SmolLM2's saved tensors.
    """
    norms = 2 * (4 + (4 if p.autocast else 2)) * a.hidden
    inputs = (5 if p.autocast else 2) * 2 * a.hidden  # what q/k/v and gate/up read
    attention = 2 * 2 * a.hidden + 2 * 2 * a.kv_dim + 4 * a.heads  # q, out; k, v; lse
    mlp = 4 * 2 * a.intermediate  # gate, up, silu(gate), their product (down's input)
    lora = 2 * lora_r * LORA_TARGETS + (5 * 2 * a.hidden if p.autocast and lora_r else 0)
    return tokens * (norms + inputs + attention + mlp + lora)


def checkpointed_layer_bytes(a: Arch, tokens: int, p: Precision) -> int:
    """What a checkpointed layer keeps: its input (the residual stream), and the keys and
    values, which rldojo's checkpointing (`training/activations.py`) keeps for the shared
    prompt's cache."""
    return tokens * ((4 if p.autocast else 2) * a.hidden + 2 * 2 * a.kv_dim)


def weight_copy_bytes(a: Arch, p: Precision, checkpointing: bool) -> int:
    """Autocast's bf16 casts of the weight matrices, saved for the backward: every layer's
    (the recomputed one's under checkpointing) and the output layer's."""
    if not p.autocast:
        return 0
    return 2 * ((1 if checkpointing else a.layers) * layer_matrices(a) + a.vocab * a.hidden)


def logit_bytes(a: Arch, tokens: int, share: float) -> int:
    """The output layer's fp32 log-probs (kept for the backward) and their gradient, at
    `share` of the tokens (1: every token, as SFT and `optim.selected_logits = false`)."""
    return int(tokens * share) * a.vocab * (4 + 4)


# -- one rank ---------------------------------------------------------------------------


def per_rank(a: Arch, p: Precision, *, lora: bool, world: int, tokens: int,
             checkpointing: bool, r: int, share: float) -> dict[str, float]:  # fmt: skip
    """GiB one rank holds at the start of the backward pass, by term."""
    adapters = a.layers * lora_layer_params(a, r) if lora else 0
    trained = adapters if lora else param_count(a)
    gathered = root_params(a) + GATHERED_LAYERS * (layer_params(a) + adapters / a.layers)
    gathered_trained = GATHERED_LAYERS * adapters / a.layers if lora else gathered
    act = layer_activation_bytes(a, tokens, p, r if lora else 0)
    if checkpointing:  # every layer's input kept, one layer's internals recomputed
        activations = a.layers * checkpointed_layer_bytes(a, tokens, p) + act
    else:
        activations = a.layers * act
    terms = {
        "params_fp32_sharded": 4 * (param_count(a) + adapters) / world,
        "grads_fp32_sharded": 4 * trained / world,
        "adamw_fp32_sharded": 8 * trained / world,
        "gathered_params": p.gathered_bytes * gathered,
        "gathered_grads": p.gathered_bytes * gathered_trained,
        "autocast_weight_copies": weight_copy_bytes(a, p, checkpointing),
        "activations": activations,
        "logits": logit_bytes(a, tokens, share),
    }
    terms["total"] = sum(terms.values())
    return {k: round(v / GIB, 3) for k, v in terms.items()}


def grid(args: argparse.Namespace) -> dict[str, Any]:
    """per_rank for every model, mode, checkpointing and world size; the largest that fits."""
    p, tokens, usable = PRECISIONS[args.precision], args.micro_batch * args.seq, GPU_GIB * HEADROOM
    rows: dict[str, Any] = {}
    fits: dict[str, Any] = {}
    for mode in ("full", "lora"):
        for ckpt in (False, True):
            key = f"{mode}/{'checkpointing' if ckpt else 'no_checkpointing'}"
            rows[key] = {a.name: {str(n): per_rank(a, p, lora=mode == "lora", world=n,
                                                   tokens=tokens, checkpointing=ckpt,
                                                   r=args.lora_r, share=args.logit_share)
                                  for n in WORLD_SIZES} for a in MODELS}  # fmt: skip
            fits[key] = {str(n): next((a.name for a in reversed(MODELS)
                                       if rows[key][a.name][str(n)]["total"] <= usable), None)
                         for n in WORLD_SIZES}  # fmt: skip
    return {"per_rank_gib": rows, "largest_fitting": fits}


# -- checks -----------------------------------------------------------------------------


def self_check() -> dict[str, Any]:
    smol = param_count(MODELS[0])
    if smol != SMOLLM2_135M_PARAMS:
        raise SystemExit(f"SmolLM2-135M: computed {smol:,} parameters, the model has "
                         f"{SMOLLM2_135M_PARAMS:,}")  # fmt: skip
    return {"smollm2_params_computed": smol, "smollm2_params_real": SMOLLM2_135M_PARAMS}


def _saved_by_layer(model: Any, ids: Any, autocast: bool) -> tuple[int, int]:
    """Bytes autograd saves in the forward of the middle decoder layer: (activations, bf16
    copies of the layer's weight matrices); the parameters themselves are not counted."""
    import torch

    layer = model.model.layers[len(model.model.layers) // 2]
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    # A linear saves its weight transposed: both orientations of each matrix.
    shapes = {s for p in layer.parameters() if p.dim() == 2 for s in (p.shape, p.shape[::-1])}
    saved: dict[int, tuple[int, bool]] = {}
    inside = [False]

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if inside[0] and ptr not in weights:
            copy = t.dtype == torch.bfloat16 and t.shape in shapes
            saved[ptr] = (t.untyped_storage().nbytes(), copy)
        return t

    hooks = [layer.register_forward_pre_hook(lambda *_: inside.__setitem__(0, True)),
             layer.register_forward_hook(lambda *_: inside.__setitem__(0, False))]  # fmt: skip
    with (torch.autocast("cpu", torch.bfloat16, enabled=autocast),
          torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)):  # fmt: skip
        model(input_ids=ids)
    for hook in hooks:
        hook.remove()
    return (sum(n for n, c in saved.values() if not c), sum(n for n, c in saved.values() if c))


def measure_smollm2(shape: tuple[int, int] = (2, 256)) -> dict[str, Any]:
    """The real SmolLM2-135M on this CPU against the formulas: its parameter count, and one
    decoder layer's saved bytes in fp32 under autocast and in bf16."""
    import torch

    from rldojo.policy.models import load_model

    a, tokens = MODELS[0], shape[0] * shape[1]
    model, _ = load_model("smollm2-135m-instruct")  # fp32, as rldojo trains it
    out: dict[str, Any] = {"kind": "measured", "params": sum(p.numel() for p in model.parameters()),
                           "layer_tokens": list(shape)}  # fmt: skip
    out["params_match"] = out["params"] == param_count(a)
    ids = torch.randint(0, a.vocab, shape)  # [B, T]
    for name, autocast in (("autocast", True), ("bf16", False)):
        if not autocast:
            model = model.to(torch.bfloat16)
        activations, copies = _saved_by_layer(model.train(), ids, autocast)
        formula = layer_activation_bytes(a, tokens, PRECISIONS[name])
        out[name] = {"layer_saved_bytes": activations, "layer_formula_bytes": formula,
                     "formula_over_measured": round(formula / activations, 4),
                     "weight_copy_bytes": copies, "weight_copy_formula": 2 * layer_matrices(a)
                     if autocast else 0}  # fmt: skip
    return out


# -- output -----------------------------------------------------------------------------


def table(result: dict[str, Any]) -> str:
    """GiB per rank (total), one block per mode; `*` marks what does not fit."""
    usable = GPU_GIB * HEADROOM
    head = f"{'model':14s} {'params':>7s} " + " ".join(f"{'N=' + str(n):>7s}" for n in WORLD_SIZES)
    lines = []
    for key, rows in result["per_rank_gib"].items():
        lines += [f"\n{key} (GiB per rank; * over {usable:.0f} GiB)", head]
        for a in MODELS:
            cells = [rows[a.name][str(n)]["total"] for n in WORLD_SIZES]
            marks = " ".join(f"{c:6.1f}{'*' if c > usable else ' '}" for c in cells)
            lines.append(f"{a.name:14s} {param_count(a) / 1e9:6.2f}B {marks}")
    lines += ["\nlargest model that fits one GPU", f"{'setting':28s} " + " ".join(
        f"{'N=' + str(n):>13s}" for n in WORLD_SIZES)]  # fmt: skip
    for key, by_world in result["largest_fitting"].items():
        lines.append(f"{key:28s} " + " ".join(f"{by_world[str(n)] or '-':>13s}"
                                              for n in WORLD_SIZES))  # fmt: skip
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", choices=sorted(PRECISIONS), default="bf16",
                        help="bf16: FSDP2's MixedPrecisionPolicy; autocast: as today")  # fmt: skip
    parser.add_argument("--micro-batch", type=int, default=4, help="sequences per micro-batch")
    parser.add_argument("--seq", type=int, default=2048, help="tokens per sequence")
    parser.add_argument("--lora-r", type=int, default=16, help="LoRA rank (`model.lora.r`)")
    parser.add_argument("--logit-share", type=float, default=1.0,
                        help="share of tokens with log-probs (1: all; rldojo's default "
                             "GRPO path takes the top-rho forking tokens only)")  # fmt: skip
    parser.add_argument("--measure", action="store_true",
                        help="check the parameter count and one layer's activations on "
                             "the real SmolLM2-135M (loads it, ~15 s)")  # fmt: skip
    add_result_args(parser, "the same tables without --measure, into a temporary folder")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    values: dict[str, Any] = {
        "kind": "computed",
        "what": "bytes per rank at the start of the backward pass under FSDP2 full sharding, "
        "from each model's architecture (benchmarks/capacity.py's docstring: the terms)",
        "settings": {"precision": args.precision, "micro_batch": args.micro_batch,
                     "seq": args.seq, "tokens": args.micro_batch * args.seq,
                     "lora_r": args.lora_r, "logit_share": args.logit_share,
                     "gpu_gib": GPU_GIB, "headroom": HEADROOM,
                     "gathered_layers": GATHERED_LAYERS, "world_sizes": list(WORLD_SIZES)},
        "models": {a.name: {**asdict(a), "params": param_count(a),
                            "lora_params": a.layers * lora_layer_params(a, args.lora_r)}
                   for a in MODELS},
        "self_check": self_check(),
        **grid(args),
    }  # fmt: skip
    if args.measure and not args.dry:
        values["measured_check"] = measure_smollm2()
    label = "dry" if args.dry else f"b{args.micro_batch}_s{args.seq}_{args.precision}"
    out = write_result("capacity", label, values, out_dir=args.results, dry=args.dry)
    print(f"computed, not measured: precision {args.precision}, micro-batch "
          f"{args.micro_batch} x {args.seq} tokens, LoRA r{args.lora_r}, log-probs at "
          f"{args.logit_share:g} of the tokens, {GPU_GIB} GiB GPU x {HEADROOM} "
          "headroom")  # fmt: skip
    print(table(values))
    if "measured_check" in values:
        print(f"\nmeasured on SmolLM2-135M: {values['measured_check']}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
