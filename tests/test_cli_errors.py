"""A new user's mistakes: each is one line on stderr naming the file/key/field, a
non-zero exit, found before a run directory exists or a model loads, and nothing touches
the network. Exit codes: 2 bad input or usage, 1 the work failed, 130 interrupted."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rldojo import cli
from rldojo.cli import app
from rldojo.config import ConfigValueError
from rldojo.training.stops import FailureBudgetExceeded, RunInterrupted

runner = CliRunner()

TINY = ["--set", "model.name=tiny-random", "--set", "rollout.prompts_per_step=2",
        "--set", "rollout.group_size=2", "--set", "sampling.max_new_tokens=4",
        "--set", "eval.tasks=2", "--set", "run.steps=1"]  # fmt: skip


REPO = Path(__file__).resolve().parent.parent


def _lines(text: str) -> list[str]:
    return [x for x in text.splitlines() if x.strip()]


def _one_line_error(result, *needles: str) -> str:
    """Exit 2, nothing on stdout, one line on stderr holding every needle."""
    assert result.exit_code == 2, result.output
    assert result.stdout == "", result.output  # `rldojo train > log` must not hide it
    lines = _lines(result.stderr)
    assert len(lines) == 1, result.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if anything tries to load a model (or reach the hub)."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    import transformers

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    monkeypatch.setattr("rldojo.policy.models._tiny_random", refuse)


def test_env_kwarg_typo_is_one_line_before_the_run_dir(tmp_path, no_model_load):
    config = tmp_path / "c.toml"
    config.write_text(f'[env]\nid = "arith-v1"\nkwargs = {{ levls = [1] }}\n'
                      f'[run]\noutput_dir = "{tmp_path / "runs"}"\n')  # fmt: skip
    result = runner.invoke(app, ["train", str(config), *TINY])
    _one_line_error(result, "c.toml", "env.kwargs.levls", "did you mean 'levels'")
    assert not (tmp_path / "runs").exists()


def test_env_kwarg_value_the_factory_rejects_is_one_line(tmp_path, no_model_load):
    out = f"run.output_dir={tmp_path / 'runs'}"
    result = runner.invoke(app, ["train", *TINY, "--set", "env.kwargs={levels=[9]}",
                                 "--set", out])  # fmt: skip
    line = _one_line_error(result, "levels")
    assert line.startswith("error: --set env.kwargs.levels: arith-v1: ")  # --set gave it, no file
    assert not (tmp_path / "runs").exists()


def test_unknown_env_is_found_before_the_run_dir_and_the_model(tmp_path, no_model_load):
    result = runner.invoke(
        app, ["train", *TINY, "--set", "env.id=arith-v2", "--set", f"run.output_dir={tmp_path}"]
    )
    line = _one_line_error(result, "unknown environment 'arith-v2'", "did you mean 'arith-v1'")
    assert line.startswith("error: --set env.id: unknown environment")  # not "defaults:"
    assert list(tmp_path.iterdir()) == []
    config = tmp_path / "c.toml"  # the file gave it: the file and the key are named
    config.write_text('[env]\nid = "arith-v2"\n')
    line = _one_line_error(runner.invoke(app, ["train", str(config), *TINY]), "did you mean")
    assert line.startswith(f"error: {config}: env.id: unknown environment 'arith-v2'")
    config.unlink()


def test_missing_model_directory_is_one_line(tmp_path, no_model_load):
    missing = tmp_path / "checkpoints" / "step_000009"
    result = runner.invoke(
        app,
        ["train", *TINY, "--set", f"model.name={missing}", "--set", f"run.output_dir={tmp_path}"],
    )
    _one_line_error(result, "no such directory")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "empty").mkdir()
    result = runner.invoke(app, ["train", *TINY, "--set", f"model.name={tmp_path / 'empty'}"])
    _one_line_error(result, "no config.json")


def test_model_name_typo_does_not_go_to_the_network(tmp_path, no_model_load, monkeypatch):
    monkeypatch.delenv("RLDOJO_ALLOW_DOWNLOAD", raising=False)
    result = runner.invoke(
        app, ["train", *TINY, "--set", "model.name=smollm2-135m-instrcut",
              "--set", f"run.output_dir={tmp_path}"],
    )  # fmt: skip
    _one_line_error(result, "neither a built-in", "did you mean 'smollm2-135m-instruct'",
                    "--allow-download")  # fmt: skip
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_missing_compare_checkpoint_fails_before_evaluating_the_first_model(
    tmp_path, no_model_load
):
    result = runner.invoke(app, ["eval", "--model", "tiny-random", "--env", "arith-v1",
                                 "--tasks", "2", "--compare", str(tmp_path / "nope")])  # fmt: skip
    _one_line_error(result, str(tmp_path / "nope"), "no such directory")


def test_missing_grade_data_file_is_one_line(tmp_path):
    spec = tmp_path / "g.json"
    spec.write_text(json.dumps({"type": "string_check", "name": "s", "operation": "eq",
                                "input": "{{sample.output_text}}", "reference": "a"}))  # fmt: skip
    rows, out = tmp_path / "rows.jsonl", tmp_path / "o.jsonl"
    result = runner.invoke(
        app, ["grade", "--grader", str(spec), "--data", str(rows), "--out", str(out)]
    )
    _one_line_error(result, "rows.jsonl", "no such file")


def test_resume_of_a_directory_that_is_no_run_is_one_line(tmp_path):
    result = runner.invoke(app, ["train", "--resume", str(tmp_path)])
    _one_line_error(result, "not a run directory")


def test_config_without_model_or_run_says_which_defaults_apply(tmp_path, capsys):
    """`rldojo train C` notes the defaults C leaves to the quickstart (`_load`, before any
    model loads; what follows is the dry run the next test checks)."""
    from rldojo.commands.train import _load

    config = tmp_path / "c.toml"
    config.write_text('[env]\nid = "arith-v1"\n')
    cfg = _load(config, ["eval.tasks=2"], None)
    out = capsys.readouterr().out
    assert cfg.model.name == "smollm2-135m-instruct" and cfg.run.steps == 12
    assert f"note: {config} has no [model]: using the default" in out
    assert f"note: {config} has no [run]: using the default (12 steps)" in out
    _load(config, ["model.name=tiny-random", "run.steps=1"], None)
    assert "note:" not in capsys.readouterr().out


@pytest.mark.slow  # loads a model
def test_dry_run_prints_the_resolved_config_and_plan_and_writes_nothing(tmp_path):
    result = runner.invoke(
        app, ["train", "--dry-run", *TINY, "--set", f"run.output_dir={tmp_path / 'runs'}"]
    )
    assert result.exit_code == 0, result.output
    out = result.output
    assert 'name = "tiny-random"' in out and "[loss]" in out  # the resolved config
    assert 'generation_dtype = "float32"' in out or 'generation_dtype = "bfloat16"' in out
    assert "steps: 1, each 4 samples" in out
    assert "held-out evaluation: 2 tasks x 2 evaluations" in out
    assert "min in all" in out and "dry run: nothing was written" in out
    # every 4 of 12 steps: before, 4, 8 and after (the last step's is "after")
    every = ["--set", "run.steps=12", "--set", "eval.every=4"]
    result = runner.invoke(
        app, ["train", "--dry-run", *TINY, *every, "--set", f"run.output_dir={tmp_path / 'runs'}"]
    )
    assert "held-out evaluation: 2 tasks x 4 evaluations" in result.output, result.output
    # without "before" (RL from an evaluated SFT checkpoint): 4, 8 and after
    no_before = [*every, "--set", "eval.before=false"]
    result = runner.invoke(
        app,
        ["train", "--dry-run", *TINY, *no_before, "--set", f"run.output_dir={tmp_path / 'runs'}"],
    )
    assert "held-out evaluation: 2 tasks x 3 evaluations" in result.output, result.output
    assert '"before"' not in result.output
    # "before" on the first task of two: counted, priced at half an evaluation
    half = ["--set", "run.steps=1", "--set", "eval.before_tasks=1"]
    result = runner.invoke(
        app, ["train", "--dry-run", *TINY, *half, "--set", f"run.output_dir={tmp_path / 'runs'}"]
    )
    assert 'held-out evaluation: 2 tasks x 2 evaluations ("before" on the first 1)' in (
        result.output
    ), result.output
    assert not (tmp_path / "runs").exists()


def test_the_plan_prices_a_short_before_evaluation_by_its_tasks():
    from rldojo.training.plan import Plan

    plan = Plan(steps=2, samples_per_step=4, max_samples_per_step=4, eval_tasks=4,
                evaluations=3, before_tasks=1, parameters=1, prompt_tokens=1, gflops=1.0,
                turns=3, step_s=10.0, eval_s=8.0, one_turn_step_s=2.0,
                one_turn_eval_s=1.0)  # fmt: skip
    assert plan.total_s == 2 * 10.0 + (2 + 1 / 4) * 8.0  # two full evaluations, 1/4 of one
    assert replace(plan, before_tasks=4).total_s == 2 * 10.0 + 3 * 8.0
    assert replace(plan, before_tasks=0, evaluations=2).total_s == 2 * 10.0 + 2 * 8.0
    assert plan.one_turn_total_s == 2 * 2.0 + (2 + 1 / 4) * 1.0  # the lower end


@pytest.mark.slow  # loads a model
def test_the_plan_prices_every_turn_of_a_multi_turn_environment():
    from rldojo.config import load_config
    from rldojo.policy.models import load_model
    from rldojo.training.inputs import check_inputs
    from rldojo.training.plan import make_plan

    model, tokenizer = load_model("tiny-random")

    def plan(*sets: str):
        config = load_config(None, ["model.name=tiny-random", "eval.tasks=2", *sets])
        return make_plan(config, check_inputs(config), model, tokenizer, gflops=0.01)

    three = plan("env.id=tictactoe-v1", "rollout.max_turns=3")
    six = plan("env.id=tictactoe-v1", "rollout.max_turns=6")
    assert (three.turns, six.turns) == (3, 6)
    assert three.one_turn_step_s == six.one_turn_step_s < three.step_s < six.step_s
    assert three.one_turn_eval_s < three.eval_s < six.eval_s
    assert three.one_turn_total_s < three.total_s
    assert "episodes of one to 3 turns" in three.lines()[-1]
    # tictactoe-v1's own limit (12 turns) caps rollout.max_turns
    assert plan("env.id=tictactoe-v1", "rollout.max_turns=40").turns == 12
    one = plan("env.id=arith-v1")  # answers once: one turn, one price
    assert one.turns == 1 and one.step_s == one.one_turn_step_s and "turns" not in one.lines()[-1]


def test_unexpected_errors_are_one_line_and_debug_shows_the_traceback(monkeypatch, capsys):
    def boom(*args, **kwargs):
        raise RuntimeError("disk on fire\nsecond line")

    monkeypatch.setattr("rldojo.envs.registry.list_envs", boom)
    monkeypatch.setattr(sys, "argv", ["rldojo", "envs"])
    monkeypatch.setitem(cli.DEBUG, "on", False)
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert _lines(captured.err) == ["error: RuntimeError: disk on fire second line (rldojo "
                                    "--debug ... shows the traceback)"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["rldojo", "--debug", "envs"])
    with pytest.raises(RuntimeError, match="disk on fire"):
        cli.main()


@pytest.mark.slow  # a fresh interpreter
def test_a_missing_config_in_a_fresh_process_is_one_line_on_stderr_exit_2(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "rldojo.cli", "train", "nonexistent.toml"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert _lines(done.stderr) == ["error: nonexistent.toml: file not found"]


EARLY = """
import json, sys
from rldojo import cli
out = []
for argv in json.loads(sys.argv[1]):
    sys.argv = ["rldojo", *argv]
    try:
        cli.main()
    except SystemExit as exc:
        out.append([exc.code, "torch" in sys.modules, "transformers" in sys.modules])
print(json.dumps(out))
"""


@pytest.mark.slow  # a fresh interpreter, so that no test has imported torch yet
def test_config_mistakes_answer_before_torch_is_imported(tmp_path):
    """A typo in an env id or its kwargs is found before the command imports torch and
    transformers (~10 s on a loaded 2-core CPU), for train, sft and distill."""
    typo = ["--set", "model.name=tiny-random", "--set", "env.kwargs={levle = 1}"]
    argvs = [["train", *typo], ["train", "--set", "env.id=arith-v2"], ["sft", *typo],
             ["distill", "--teacher", "tiny-random", *typo]]  # fmt: skip
    done = subprocess.run([sys.executable, "-c", EARLY, json.dumps(argvs)], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)  # fmt: skip
    assert json.loads(done.stdout) == [[2, False, False]] * len(argvs), done.stderr
    errors = _lines(done.stderr)
    assert len(errors) == len(argvs), done.stderr
    assert all("did you mean 'levels'" in errors[i] for i in (0, 2, 3)), errors
    assert "unknown environment 'arith-v2'" in errors[1]


def test_usage_errors_exit_2_on_stderr():
    result = runner.invoke(app, ["train", "--no-such-flag"])
    assert result.exit_code == 2 and result.stdout == ""
    assert "No such option" in result.stderr


@pytest.mark.parametrize(
    ("stop", "code", "line"),
    [
        (FailureBudgetExceeded("3 of 4 rollouts could not be scored (grade/error)"), 1,
         "error: 3 of 4 rollouts could not be scored (grade/error)"),
        # an interrupt the user asked for is no error
        (RunInterrupted("interrupted at step 2; resume with: rldojo train --resume runs/x",
                        step=2), 130, "interrupted at step 2; resume with: rldojo train "
         "--resume runs/x"),
        (ConfigValueError("model.lora.layers: layer 9 is out of range"), 2,  # a user error
         "error: model.lora.layers: layer 9 is out of range"),
    ],
)  # fmt: skip
def test_main_maps_a_run_stop_or_user_error_to_its_exit_code_and_one_line(
    monkeypatch, capsys, stop, code, line
):
    def stopped(*args, **kwargs):
        raise stop

    monkeypatch.setattr("rldojo.envs.registry.list_envs", stopped)
    monkeypatch.setattr(sys, "argv", ["rldojo", "--debug", "envs"])  # no traceback either way
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code == code
    captured = capsys.readouterr()
    assert captured.out == "" and _lines(captured.err) == [line]


def test_debug_shows_the_traceback_a_failed_grade_kept(monkeypatch, capsys):
    """A stop for failed grades is one line; with --debug the user's frame comes first."""
    trace = 'Traceback (most recent call last):\n  File "mine.py", line 3, in my_reward\n' \
            "KeyError: 'c'\n"  # fmt: skip
    stop = FailureBudgetExceeded("grader error in 8/8 samples of step 1: KeyError: 'c'",
                                 traceback=trace)  # fmt: skip

    def stopped(*args, **kwargs):
        raise stop

    monkeypatch.setattr("rldojo.envs.registry.list_envs", stopped)
    for argv, shown in ((["rldojo", "envs"], False), (["rldojo", "--debug", "envs"], True)):
        monkeypatch.setitem(cli.DEBUG, "on", False)
        monkeypatch.setattr(sys, "argv", argv)
        with pytest.raises(SystemExit) as info:
            cli.main()
        err = capsys.readouterr().err
        assert info.value.code == 1 and _lines(err)[-1] == f"error: {stop}"
        assert ('File "mine.py", line 3, in my_reward' in err) is shown


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium (make test)")
def test_a_batch_larger_than_the_env_holds_at_once_is_one_line(tmp_path, no_model_load):
    """web-crm-v1 holds `browser_contexts` episodes at once; the lockstep engine opens a
    whole batch before its first turn, so 20 eval tasks on 16 contexts would time out.
    (The episodes engine opens each episode when a slot is free: no refusal there.)"""
    out = f"run.output_dir={tmp_path / 'runs'}"
    web = 'env.kwargs={db_size="small", browser_contexts=16}'
    lockstep = ["--set", "rollout.engine=lockstep"]
    result = runner.invoke(app, ["train", *TINY, "--set", "env.id=web-crm-v1", "--set", web,
                                 "--set", "eval.tasks=20", "--set", out, *lockstep])  # fmt: skip
    _one_line_error(result, "env.kwargs.browser_contexts: web-crm-v1 holds 16 episodes at once",
                    "eval.tasks starts 20 together")  # fmt: skip
    group = ["--set", "rollout.prompts_per_step=3", "--set", "rollout.group_size=8"]
    result = runner.invoke(app, ["train", *TINY, "--set", "env.id=web-crm-v1", "--set", web,
                                 *group, "--set", out, *lockstep])  # fmt: skip
    _one_line_error(result, "rollout.prompts_per_step x group_size starts 24 together")
    assert not (tmp_path / "runs").exists()


def test_only_the_lockstep_engine_refuses_a_batch_larger_than_an_env_holds():
    """The episodes engine opens each episode when a slot is free, in this process; Ray's
    rollout workers and the lockstep engine open the whole batch first."""
    from types import SimpleNamespace

    from rldojo.config import load_config
    from rldojo.envs.kwargs import EnvKwargsError
    from rldojo.training.inputs import check_episodes_at_once

    slot = SimpleNamespace(env_id="web-crm-v1", max_at_once=(4, "browser_contexts"),
                           test_tasks=[object()] * 8)  # fmt: skip
    mixture = SimpleNamespace(slots={"web-crm-v1": slot})
    for sets, refused in (([], True), (["rollout.engine=episodes"], False),
                          (["rollout.engine=episodes", "run.cluster=ray"], True)):  # fmt: skip
        config = load_config(None, sets)
        if refused:
            with pytest.raises(EnvKwargsError, match="holds 4 episodes at once"):
                check_episodes_at_once(config, mixture)
        else:
            check_episodes_at_once(config, mixture)


def test_a_missing_data_file_is_one_line_naming_it(tmp_path, no_model_load):
    missing = tmp_path / "nope.jsonl"
    result = runner.invoke(app, ["train", *TINY, "--set", "env.id=math-v1", "--set",
                                 f'env.kwargs={{path="{missing}"}}', "--dry-run"])  # fmt: skip
    _one_line_error(result, f"{missing}: no such file")


def test_an_env_rejecting_its_kwargs_is_named_once(tmp_path, no_model_load):
    data = tmp_path / "m.jsonl"
    data.write_text('{"problem": "1+1", "answer": "2"}\n')
    kwargs = f'env.kwargs={{path="{data}", test_fraction=1.5}}'
    result = runner.invoke(app, ["train", *TINY, "--set", "env.id=math-v1", "--set", kwargs,
                                 "--dry-run"])  # fmt: skip
    expected = "env.kwargs.test_fraction: math-v1: expected a value less than 1, got 1.5"
    line = _one_line_error(result, expected)
    assert line.count("math-v1") == 1


@pytest.mark.slow  # loads a model
def test_lora_layers_the_model_lacks_name_the_config_file_and_key(tmp_path, monkeypatch):
    pytest.importorskip("peft")
    monkeypatch.chdir(REPO)  # the README's command line, relative path and all
    result = runner.invoke(app, ["train", "examples/agentic_crm.toml", "--set",
                                 "model.name=tiny-random", "--set", "eval.tasks=0", "--set",
                                 f"run.output_dir={tmp_path}"])  # fmt: skip
    assert result.exit_code == 2, result.output
    assert _lines(result.stderr) == [
        "error: examples/agentic_crm.toml: model.lora.layers: "
        "layer 20 is out of range for tiny-random (2 layers: 0-1)"
    ]


def test_a_grade_where_no_row_was_scored_says_so_on_stderr_exit_1(tmp_path):
    import socket

    with socket.socket() as s:  # bound, then closed: connecting is refused at once
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    spec = {"grader": {"type": "score_model", "name": "j", "model": "m",
                       "input": [{"role": "user", "content": "Rate {{sample.output_text}}"}]},
            "judge": {"base_url": url, "max_retries": 0}, "cache": False}  # fmt: skip
    (tmp_path / "g.json").write_text(json.dumps(spec))
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"item": {"answer": "4"}, "sample": {"output_text": "4"}}) + "\n")
    args = ["--grader", str(tmp_path / "g.json"), "--data", str(rows)]
    result = runner.invoke(app, ["grade", *args, "--out", str(tmp_path / "o.jsonl")])
    assert result.exit_code == 1, result.output
    assert "error:" not in result.stdout and "rows:" in result.stdout  # the summary stays
    assert _lines(result.stderr)[0].startswith("error: no row was scored (1 failed)")
