"""arith-v1: arithmetic word problems at levels of difficulty, graded by the number."""
