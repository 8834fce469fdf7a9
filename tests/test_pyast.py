"""`rldojo.pyast`: every in-process parse of Python text runs under the one lock (CPython
3.11 fails two concurrent AST constructions with a SystemError)."""

from __future__ import annotations

import ast

from rldojo import pyast
from rldojo.envs.tool_calls import parse_turn
from rldojo.graders.code.cases import convert_asserts


def test_parses_run_under_the_lock_and_return_what_ast_returns(monkeypatch):
    held: list[bool] = []
    real_parse = ast.parse

    def recording_parse(*args, **kwargs):
        held.append(pyast._LOCK.locked())
        return real_parse(*args, **kwargs)

    monkeypatch.setattr(ast, "parse", recording_parse)
    tree = pyast.parse("x = 1")
    assert isinstance(tree, ast.Module) and isinstance(tree.body[0], ast.Assign)
    assert pyast.literal_eval("{'a': [1, True, None]}") == {"a": [1, True, None]}
    # the callers go through it: a HumanEval-style suite, a tool call in Python syntax
    assert convert_asserts("def check(candidate):\n    assert candidate(2) == 4\n", "f")
    turn = parse_turn("<tool_call>{'name': 'calc', 'arguments': {'x': 1}}</tool_call>")
    assert [c.name for c in turn.calls] == ["calc"]
    assert len(held) >= 4 and all(held)
    assert not pyast._LOCK.locked()
