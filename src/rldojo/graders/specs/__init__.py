"""rldojo.graders.specs: building graders from OpenAI grader specs and rldojo's TOML.

Bottom to top (each imports only those above it in this list):

- `common`: `GraderSpecError`, `check_keys`, `require`.
- `embedding`: embedding models for ``text_similarity``'s ``cosine``.
- `context`: `LoadContext` (shared judges, cache, embedders), the `GRADERS` registry
  (`rldojo.plugins`; the one upward reference: it imports the built-in builders below
  on first use), `register_grader_type`, `make_backend`.
- builders: `openai_models` (score_model, label_model), `openai_python` (python),
  `openai_text` (string_check, text_similarity, multi), `rldojo_types` (rubric,
  group_judge, span_penalty, exact_match, math_verify).
- `loading`: `load(spec)`, `read_spec`, `SpecGrader`.

`rldojo.graders.load` is `loading.load`.
"""
