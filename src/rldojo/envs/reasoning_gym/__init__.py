"""reasoning-gym-v1: the procedurally generated tasks of the reasoning-gym package."""
