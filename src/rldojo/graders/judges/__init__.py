"""rldojo.graders.judges: LLM judges and the graders built on them.

- `client`: judge backends (OpenAI-compatible HTTP, in-process engines), `JudgeClient`
  with retries, concurrency, counters and provenance; `ask_verdict`, `judge_failure`.
- `cache`: the SQLite cache of judge replies.
- `injection`: fencing, strict verdicts and the ``hack:judge_injection`` detector.
- `rubric`: `RubricGrader` (signed-points criteria, optional token rewards).
- `group`: `GroupJudgeGrader` (one judge call scores a whole group).
- `meta_eval`: judge agreement with human labels, and length/position bias probes.

Depends on the top-level graders modules (`base`, `token_rewards`, `offline`,
`openai_templates`), never on `specs` or `code`. The public names are exported by
`rldojo.graders`.
"""
