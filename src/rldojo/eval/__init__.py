"""rldojo.eval."""
