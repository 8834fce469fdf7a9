"""tests/warm.py, the fork server the slow tests start their Python children from: a warm
child is the `python` command line it was given (argv, path, environment, directory,
streams, exit status, signals, threads and atexit at its end), forked from a process that
has torch and rldojo imported; a child that disagrees on an import-time variable gets a
server of its own; the shell scripts' stand-in exits as its child did."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import warm

pytestmark = pytest.mark.slow  # starts the fork server (imports torch) and its children

PY = sys.executable


def test_a_child_is_the_command_line_it_was_given(tmp_path):
    code = textwrap.dedent("""
        import json, os, sys
        warm = "torch" in sys.modules  # before any import of the command's own
        print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(),
                          "x": os.environ.get("X"), "main": __name__, "warm": warm,
                          "parent": os.getppid()}))
        sys.stderr.write("to stderr\\n")
        sys.exit(3)
    """)
    env = {**os.environ, "X": "1", "PYTHONPATH": str(tmp_path)}
    done = warm.run([PY, "-c", code, "a", "b"], capture_output=True, text=True, cwd=tmp_path,
                    env=env)  # fmt: skip
    assert done.returncode == 3 and done.stderr == "to stderr\n"
    seen = json.loads(done.stdout)
    assert seen["argv"] == ["-c", "a", "b"] and seen["path0"] == ""
    assert seen["cwd"] == str(tmp_path) and seen["x"] == "1" and seen["main"] == "__main__"
    assert seen["warm"] and seen["parent"] != os.getpid()  # forked from the server

    script = tmp_path / "script.py"
    script.write_text("import json, sys\nprint(json.dumps([__file__, sys.argv, sys.path[:2]]))\n")
    done = warm.run([PY, str(script), "x"], capture_output=True, text=True, env=env)
    assert json.loads(done.stdout) == [str(script), [str(script), "x"], [str(tmp_path)] * 2]
    done = warm.run([PY, "-", "q"], input="import sys; print(sys.argv)", capture_output=True,
                    text=True)  # fmt: skip
    assert done.stdout == "['-', 'q']\n"


def test_a_child_ends_as_python_ends():
    def run(code: str) -> subprocess.CompletedProcess:
        return warm.run([PY, "-c", textwrap.dedent(code)], capture_output=True, text=True)

    done = run("import sys; sys.exit('bye')")
    assert (done.returncode, done.stderr) == (1, "bye\n")
    done = run("raise ValueError('x')")  # the traceback starts at the command's code
    assert done.returncode == 1
    assert done.stderr.splitlines()[1:] == ['  File "<string>", line 1, in <module>',
                                            "ValueError: x"]  # fmt: skip
    assert run("raise KeyboardInterrupt").returncode == -signal.SIGINT
    done = run("""
        import atexit, threading, time
        atexit.register(lambda: print("atexit"))
        threading.Thread(target=lambda: (time.sleep(0.2), print("thread"))).start()
    """)  # a thread is joined, then atexit runs
    assert (done.returncode, done.stdout) == (0, "thread\natexit\n")
    done = run("import sys; sys.stdout.write('no newline')")
    assert done.stdout == "no newline"


def test_signals_reach_the_child_and_its_status_comes_back():
    proc = warm.Popen([PY, "-c", "import time; print('up', flush=True); time.sleep(600)"],
                      stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.1)
    assert proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    proc.stdout.close()


def test_an_import_time_variable_gets_a_server_that_agrees():
    # rldojo reads RLDOJO_DEBUG once, when imported: a server without it cannot serve this
    code = "from rldojo.commands.ui import DEBUG; print(DEBUG['on'])"
    plain = {k: v for k, v in os.environ.items() if k != "RLDOJO_DEBUG"}
    for env, expected in ((plain, "False"), ({**plain, "RLDOJO_DEBUG": "1"}, "True")):
        done = warm.run([PY, "-c", code], capture_output=True, text=True, env=env)
        assert done.stdout.strip() == expected


def test_the_stand_in_exits_as_its_child_did(tmp_path):
    python = warm.python()
    line = (f"{python} -c 'import sys; sys.exit(3)'; echo $?; "
            f"{python} -c 'import os; os.kill(os.getpid(), 9)'; echo $?; "
            f"timeout 1 {python} -c 'import time; time.sleep(600)'; echo $?")  # fmt: skip
    done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["3", str(128 + 9), "124"]  # timeout's SIGTERM forwarded


def test_cold_mode_runs_plain_subprocesses(monkeypatch):
    monkeypatch.setenv("RLDOJO_TEST_COLD", "1")
    done = warm.run([PY, "-c", "import os; print(os.getppid())"], capture_output=True, text=True)
    assert done.stdout.strip() == str(os.getpid())
    assert warm.python() == sys.executable
