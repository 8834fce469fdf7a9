"""rldojo.graders.code: grading code by tests run in `rldojo.sandbox`.

- `grader`: `CodeTestsGrader`, `check_solution`, `load_humaneval`, `suite_from_info`.
- `cases`: test cases from `Task.info` (calls, stdin/stdout, assert suites).
- `scoring`: from the driver's per-test records to a `Score`.
- `replay`: the three-run replay path for computed or property-checking assert suites.
- `values`: type-tagged values across the sandbox boundary (shipped into the sandbox).
- `driver`: the trusted driver that runs inside the sandbox (shipped; stdlib only).

Imports nothing else from `rldojo.graders`.
"""
