"""Do fully masked attention rows (left padding) put NaN into gradients? Plain SDPA vs
rldojo's `SAFE_SDPA` (`rldojo.policy.attention`), on this machine's device.

    python benchmarks/sdpa_padding_check.py [--device cuda] [--results DIR | --out FILE] [--dry]

1. `kernels`: `F.scaled_dot_product_attention` alone, per SDPA backend (default, flash,
   efficient, math; cuDNN on CUDA) and dtype, over left-padded batches of several
   lengths: a boolean causal mask whose padding rows are all False ("plain") or with
   those rows unmasked ("safe"). The loss reads real rows only; reported: cases with a
   NaN in the real rows' output, cases with a NaN in the gradient of q, k or v, and the
   largest error of a real row's output against the fp32 math kernel's.
2. `model`: a small random Llama (transformers) in bf16 autocast, a left-padded batch,
   the loss on real tokens; cases whose weight gradients hold a NaN, with the model's
   attention "sdpa" and `SAFE_SDPA`.
3. `cost`: a SmolLM2-shaped model's forward on 8 left-padded rows of 1024 tokens, "sdpa"
   vs `SAFE_SDPA` (bf16 autocast, medians of 3): what the mask's extra pass costs.
Needs torch and transformers only (PYTHONPATH=src for rldojo.policy.attention). Writes
benchmarks/results/sdpa_padding_check/<device>.json (`results_io`), or --out FILE.
`--dry`: the two shortest lengths, and the cost on 2 layers x 64 tokens once, into a
temporary folder.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import add_result_args, write_result

from rldojo.policy.attention import SAFE_SDPA, use_safe_sdpa

LENGTHS = [(24, 3), (64, 17), (100, 40), (129, 64), (256, 130)]  # (L, padding of row 1)


def _mask(length: int, pad: int, device: str, safe: bool) -> torch.Tensor:
    """[2, 1, L, L] causal mask; row 1's first `pad` positions are padding."""
    keys = torch.ones(2, length, dtype=torch.bool, device=device)
    keys[1, :pad] = False
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    mask = causal[None, None] & keys[:, None, None, :]  # [2, 1, L, L]
    return mask | ~mask.any(-1, keepdim=True) if safe else mask


def kernels(device: str) -> list[dict]:
    backends = {"default": None, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}  # fmt: skip
    if device == "cuda":
        backends["cudnn"] = SDPBackend.CUDNN_ATTENTION
    out = []
    for name, backend in backends.items():
        for dtype in (torch.bfloat16, torch.float32):
            for safe in (False, True):
                row = {"backend": name, "dtype": str(dtype), "mask": "safe" if safe else "plain",
                       "cases": 0, "nan_output": 0, "nan_grad": 0, "max_err_real": 0.0,
                       "error": None}  # fmt: skip
                for length, pad in LENGTHS:
                    g = torch.Generator(device="cpu").manual_seed(length)
                    q, k, v = (torch.randn(2, 4, length, 64, generator=g).to(device, dtype)
                               .requires_grad_() for _ in range(3))  # fmt: skip
                    real = torch.ones(2, 1, length, 1, device=device, dtype=dtype)
                    real[1, :, :pad] = 0
                    try:
                        with sdpa_kernel([backend]) if backend else nullcontext():
                            o = F.scaled_dot_product_attention(q, k, v, _mask(length, pad, device,
                                                                              safe))  # fmt: skip
                            torch.where(real.bool(), o, 0).float().sum().backward()
                    except RuntimeError as exc:  # the backend does not take this case
                        row["error"] = str(exc).splitlines()[0][:160]
                        continue
                    with sdpa_kernel([SDPBackend.MATH]):  # the reference: fp32, math kernel
                        exact = [t.detach().float() for t in (q, k, v)]
                        ref = F.scaled_dot_product_attention(*exact, _mask(length, pad, device,
                                                                           False))  # fmt: skip
                    err = (o.float() - ref).abs()[real.bool().expand_as(o)].max().item()
                    row["max_err_real"] = max(row["max_err_real"], err)
                    row["cases"] += 1
                    row["nan_output"] += int(o[real.bool().expand_as(o)].isnan().any())
                    row["nan_grad"] += int(any(t.grad.isnan().any() for t in (q, k, v)))
                out.append(row)
    return out


def model(device: str) -> list[dict]:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2)  # fmt: skip
    out = []
    for attention in ("sdpa", SAFE_SDPA):
        torch.manual_seed(0)
        net = LlamaForCausalLM(config).to(device)
        if attention == SAFE_SDPA:
            use_safe_sdpa(net)
        row = {"attention": net.config._attn_implementation, "cases": 0, "nan_loss": 0,
               "nan_grad": 0, "losses": []}  # fmt: skip
        for length, pad in LENGTHS:
            ids = torch.randint(3, 512, (2, length), device=device)
            am = torch.ones(2, length, dtype=torch.long, device=device)
            am[1, :pad] = 0
            pos = (am.cumsum(-1) - 1).clamp(min=0)
            net.zero_grad(set_to_none=True)
            with torch.autocast(device, dtype=torch.bfloat16):
                logits = net(input_ids=ids, attention_mask=am, position_ids=pos).logits
            loss = F.cross_entropy(logits[:, :-1].float()[am[:, 1:].bool()],
                                   ids[:, 1:][am[:, 1:].bool()])  # fmt: skip
            loss.backward()
            row["cases"] += 1
            row["nan_loss"] += int(loss.isnan())
            row["losses"].append(round(loss.item(), 5))
            row["nan_grad"] += int(any(p.grad.isnan().any() for p in net.parameters()
                                       if p.grad is not None))  # fmt: skip
        out.append(row)
    return out


def cost(device: str, reps: int = 3, tokens: int = 1024, layers: int = 30) -> dict:
    """Seconds per no-grad forward of a SmolLM2-135M-shaped Llama (random weights) on 8
    left-padded rows of 1024 tokens, "sdpa" vs `SAFE_SDPA` interleaved; medians. What the
    mask's extra pass costs against the forward it belongs to."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=layers, num_attention_heads=9,
                         num_key_value_heads=3, tie_word_embeddings=True)  # fmt: skip
    net = LlamaForCausalLM(config).to(device).eval()
    ids = torch.randint(3, 49152, (8, tokens), device=device)
    am = torch.ones(8, tokens, dtype=torch.long, device=device)
    am[1, : tokens * 300 // 1024], am[2, : tokens * 700 // 1024], am[3, : tokens // 20] = 0, 0, 0
    pos = (am.cumsum(-1) - 1).clamp(min=0)
    times: dict[str, list[float]] = {"sdpa": [], SAFE_SDPA: []}
    for _ in range(reps + 1):  # the first round warms up
        for attention in times:
            if attention == SAFE_SDPA:
                use_safe_sdpa(net)
            else:
                net.set_attn_implementation("sdpa")
            sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
            sync()
            t0 = time.perf_counter()
            with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
                net.model(input_ids=ids, attention_mask=am, position_ids=pos)
            sync()
            times[attention].append(time.perf_counter() - t0)
    median = {k: statistics.median(v[1:]) for k, v in times.items()}
    return {"shape": [8, tokens], "layers": layers, "forward_s": median,
            "overhead": median[SAFE_SDPA] / median["sdpa"] - 1}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, help="this file instead")
    add_result_args(parser, "the two shortest lengths; the cost on 2 layers x 64 tokens, once")
    args = parser.parse_args()
    if args.dry:
        del LENGTHS[2:]
    shrink = {"reps": 1, "tokens": 64, "layers": 2} if args.dry else {}
    result = {"device": args.device, "torch": torch.__version__,
              "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
              "kernels": kernels(args.device), "model": model(args.device),
              "cost": cost(args.device, **shrink)}  # fmt: skip
    path = write_result("sdpa_padding_check", args.device, result, out_dir=args.results,
                        path=args.out, seed=0, dry=args.dry)  # fmt: skip
    print(json.dumps(result, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
