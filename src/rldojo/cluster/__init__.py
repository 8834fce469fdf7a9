"""rldojo.cluster."""
