"""File templates of `rldojo new-env`, as `string.Template` strings (``$name``, ``$camel``).

`common` holds the files every scaffold gets (pyproject.toml, the package ``__init__``);
`single_turn` and `tool_env` hold the environment, grader, tests and train config of the
two kinds. Python strings rather than data files, so they ship with the package and need
no package-data entry. A literal ``$`` in a template is written ``$$``.
"""
