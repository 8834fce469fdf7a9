"""Training: the run loop and its objectives (GRPO, SFT, distillation), losses, token
batches, the policy update, preflight checks. `rldojo.train(...)` (`rldojo.api`) is the
front door; docs/architecture.md, "One run loop, three objectives", is the map."""
