"""Templates shared by both scaffolds: the package metadata and the package ``__init__``."""

PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "$name"
version = "0.1.0"
description = "$description"
requires-python = ">=3.11"
dependencies = ["rldojo"]

# After `pip install -e .` the id $name-v1 works from any directory:
#   rldojo check-env $name-v1
#   rldojo train --set env.id=$name-v1
[project.entry-points."rldojo.envs"]
"$name-v1" = "$name.env:${camel}Env"

[tool.setuptools.packages.find]
include = ["$name", "$name.*"]

[tool.ruff]
line-length = 100

[tool.pytest.ini_options]
pythonpath = ["."]
testpaths = ["tests"]
"""

INIT = '''\
"""$name: the rldojo environment $name-v1 and its grader."""

from $name.env import ${camel}Env
from $name.grader import ${camel}Grader

__all__ = ["${camel}Env", "${camel}Grader"]
'''
