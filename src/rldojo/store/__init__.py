"""rldojo.store."""
