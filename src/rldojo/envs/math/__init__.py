"""math-v1: math problems from a file or dataset, graded with math-verify."""
