"""rldojo.rollout."""
