"""openenv-v1: a running OpenEnv server as an environment (`env`), through OpenEnv's own
client; `wire` maps turns to the server's actions and observations to messages, `grader`
scores an episode by the server's rewards. The other direction (rldojo's environments
served to OpenEnv's clients) is `rldojo.interop.openenv_server`."""
