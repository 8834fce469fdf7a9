"""rldojo.train."""
