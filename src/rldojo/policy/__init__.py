"""rldojo.policy."""
