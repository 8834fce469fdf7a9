"""What a job's worker says it is doing (`RUN/progress.jsonl`, written by `JobPhases`)
becomes the job's events, each line once, also after the service restarts."""

from __future__ import annotations

from rldojo.service.runner import JobPhases
from rldojo.service.state import ServiceState
from rldojo.service.watch import PROGRESS, RunWatcher


def test_a_workers_phases_become_job_events_once(tmp_path):
    state = ServiceState(tmp_path / "data")
    run = tmp_path / "run"
    run.mkdir()
    job = {"id": "ftjob-1", "run_dir": str(run), "steps": 2, "owner": "a",
           "method": {"type": "reinforcement"}}  # fmt: skip
    phases = JobPhases(run)
    phases.write("Loading model tiny-random")
    phases.on_message("converting SmolLM2-135M-Instruct from GGUF (once; cached in /c)")
    phases.on_start({"step": 0, "total_steps": 2})
    for done in range(5):  # a line at the start and halfway; the result is a metrics event
        phases.on_eval_progress("before", done, 4)
    with (run / PROGRESS).open("a") as f:
        f.write('{"message": "a line being wri')  # waits for its end
    watcher = RunWatcher(state)
    watcher.watch(job)
    watcher.watch(job)
    RunWatcher(state).watch(job)  # a restarted service reads the file from its start
    events = list(reversed(state.events(job["id"])))
    assert [e["message"] for e in events] == [
        "Loading model tiny-random",
        "converting SmolLM2-135M-Instruct from GGUF (once; cached in /c)",
        "Model and data loaded: training 2 steps",
        "Evaluating before: 0/4 tasks",
        "Evaluating before: 2/4 tasks",
    ]
    assert all(e["type"] == "message" and e["data"]["kind"] == "progress" for e in events)
    assert [e["data"]["line"] for e in events] == [1, 2, 3, 4, 5]
    # the worker was killed in the middle of a line; the resumed run's lines come after it
    phases.on_start({"step": 1, "total_steps": 2})
    watcher.watch(job)
    assert (
        state.events(job["id"])[0]["message"] == "Model and data loaded: training from step 2 of 2"
    )
    assert len(state.events(job["id"])) == 6  # the unfinished line is no event
