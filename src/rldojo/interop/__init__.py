"""rldojo in other projects' standards: its environments served to their clients.

`served_episode` plays one episode of any rldojo environment for a caller outside rldojo
(reset, turns, the grader's score at the end; every failure a status, never a reward of
0); `openenv_server` wraps it in OpenEnv's own server classes (`rldojo env serve`). The
other direction, an OpenEnv server as an rldojo environment, is the environment family
`rldojo.envs.openenv` (`openenv-v1`). docs/interop.md has the conformance table.
"""
