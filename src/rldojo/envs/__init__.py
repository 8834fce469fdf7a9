"""rldojo.envs."""
