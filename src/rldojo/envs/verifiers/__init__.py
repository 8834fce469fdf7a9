"""verifiers-v1: an environment module written for Prime Intellect's `verifiers` library
(its classic API: `SingleTurnEnv`, `MultiTurnEnv`, `ToolEnv`, `Parser`, `Rubric`) as an
rldojo environment. `loading` finds the module and turns its datasets into tasks,
`messages` converts between verifiers' messages and rldojo's, `episode` drives the
verifiers environment one policy turn at a time (and rebuilds a finished episode's state
for grading), `env` is the `Env`, `grader` runs the rubric's reward functions with
rldojo's timeouts and statuses. Needs ``pip install 'rldojo[verifiers]'``."""
