"""rldojo.sandbox."""
