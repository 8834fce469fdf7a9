"""rldojo.service: a self-hosted, OpenAI-compatible fine-tuning service.

`rldojo service --data-dir DIR` serves under `/v1` what the official `openai` client
calls for fine-tuning: files, supervised jobs (`rldojo sft`) and reinforcement jobs with
OpenAI grader specs (`rldojo train`), results files, graders validate/run, models and
chat/text completions from the fine-tuned models.

Bottom to top:

- `errors`: OpenAI's error body; `settings`: the operator's choices and API keys.
- `state`: SQLite (files, jobs, events, checkpoints), written before each reply.
- `rft_env`: the environment over RFT JSONL rows (checked with line numbers).
- `sft_data`: supervised chat rows checked as demonstrations; the validation loss.
- `judge`: grader specs checked for the service; the operator's judge endpoint
  (`--judge-base-url`) for model graders, its key kept out of every file.
- `job_spec`: a create request checked, hyperparameters resolved, the `TrainConfig`.
- `runner`: what a job's worker process runs (`run_training` or `run_sft` in the job's
  run dir).
- `watch`, `results`: run directories into events and checkpoints; the results CSV.
- `scheduler`: validate, queue, one worker process per job, success and failure.
- `api_jobs`, `api_models`: the routes; `app`: auth and errors; `server`: uvicorn.
"""

from rldojo.service.server import ServiceHandle, serve_forever, start_service
from rldojo.service.settings import ServiceSettings, load_api_keys

__all__ = ["ServiceHandle", "ServiceSettings", "load_api_keys", "serve_forever", "start_service"]
