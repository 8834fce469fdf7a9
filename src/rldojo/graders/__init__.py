"""rldojo.graders."""
