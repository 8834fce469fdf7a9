"""Board games against a scripted opponent (tictactoe-v1, connect4-v1): `rules` (the
boards), `env` (the environments and their grader), `expert` (the demonstrations' player)."""
