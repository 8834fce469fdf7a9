"""Load on `rldojo service` over loopback: 50 jobs queued by 5 concurrent clients and
2,000 mixed read requests while a job trains.

1. Start the service (a subprocess, `python -m rldojo.cli service --port 0`, two keys).
2. Create one job that trains `tiny-random` for many steps (it runs alone: the default
   `--max-concurrent-jobs 1`), wait until it is `running`.
3. 5 client threads create 10 jobs each (50 queued behind it), then the same threads
   send 2,000 reads: jobs list (paginated), job get, events, checkpoints, files list,
   models list. Every request's latency is recorded; any exception counts as a failure.
4. Check that no job is lost (all 51 listed, by paging through every key's jobs), that
   the training job was still `running` after the reads, then cancel everything (to
   bound the run: the 50 queued jobs never train).
5. Baseline: 400 reads of the same mix, same threads, with nothing training.

Writes benchmarks/results/service_load/default.json (`results_io`; or `--out FILE`):
failures, p50/p95/p99/max read latency under load and at baseline, and their ratio.
Loopback only; no network. `--dry`: 2 jobs from 2 clients, 20 reads (baseline too), into
a temporary folder.
Usage: python benchmarks/service_load.py [--reads 2000] [--jobs 50] [--clients 5]
    [--results DIR | --out FILE] [--dry]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
from results_io import add_result_args, write_result  # benchmarks/ is on sys.path

KEYS = ("sk-load-a", "sk-load-b")
GRADER = {
    "type": "python",
    "name": "len",
    "source": "def grade(sample, item):\n    return min(1.0, len(sample['output_text']) / 20)\n",
}


def start(data_dir: Path) -> tuple[subprocess.Popen[str], str]:
    env = dict(os.environ, RLDOJO_API_KEYS=",".join(KEYS), PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rldojo.cli",
            "service",
            "--data-dir",
            str(data_dir),
            "--port",
            "0",
            "--job-threads",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if m := re.search(r"http://127\.0\.0\.1:\d+/v1", line):
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
            return proc, m.group(0)
    raise RuntimeError("service did not start")


def until(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


def reads(
    clients: list[openai.OpenAI], n: int, job_ids: list[list[str]], threads: int
) -> tuple[list[float], dict[str, list[float]], list[str]]:
    rng = random.Random(0)
    plan = [
        (
            rng.randrange(len(clients)),
            rng.choice(["jobs.list", "jobs.get", "events", "checkpoints", "files.list", "models"]),
        )
        for _ in range(n)
    ]
    latencies: list[float] = []
    by_kind: dict[str, list[float]] = {}
    failures: list[str] = []
    lock = threading.Lock()

    def one(item: tuple[int, str]) -> None:
        who, kind = item
        c = clients[who]
        job = rng.choice(job_ids[who])  # its own key's jobs (another key's are 404)
        t0 = time.perf_counter()
        try:
            {
                "jobs.list": lambda: c.fine_tuning.jobs.list(limit=20),
                "jobs.get": lambda: c.fine_tuning.jobs.retrieve(job),
                "events": lambda: c.fine_tuning.jobs.list_events(job, limit=20),
                "checkpoints": lambda: c.fine_tuning.jobs.checkpoints.list(job),
                "files.list": lambda: c.files.list(),
                "models": lambda: c.models.list(),
            }[kind]()
        except Exception as exc:
            with lock:
                failures.append(f"{kind}: {type(exc).__name__}: {exc}"[:200])
            return
        dt = time.perf_counter() - t0
        with lock:
            latencies.append(dt)
            by_kind.setdefault(kind, []).append(dt)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, plan))
    return latencies, by_kind, failures


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_ms": pct(values, 0.50),
        "p95_ms": pct(values, 0.95),
        "p99_ms": pct(values, 0.99),
        "max_ms": round(1000 * max(values), 2),
    }


def all_jobs(client: openai.OpenAI) -> list[str]:
    return [j.id for j in client.fine_tuning.jobs.list(limit=100)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reads", type=int, default=2000)
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--clients", type=int, default=5)
    ap.add_argument("--out", type=Path, default=None, help="this file instead")
    add_result_args(ap, "2 jobs from 2 clients, 20 reads, into a temporary folder")
    args = ap.parse_args()
    if args.dry:
        args.reads, args.jobs, args.clients = 20, 2, 2
    data = Path(tempfile.mkdtemp(prefix="rldojo-service-load-"))
    proc, url = start(data)
    started = time.perf_counter()
    try:
        clients = [
            openai.OpenAI(base_url=url, api_key=KEYS[i % 2], max_retries=0, timeout=60)
            for i in range(args.clients)
        ]
        path = data / "train.jsonl"
        path.write_text(
            "".join(
                json.dumps(
                    {"messages": [{"role": "user", "content": f"Say {i}"}], "answer": str(i)}
                )
                + "\n"
                for i in range(8)
            )
        )
        files = []
        for c in clients[:2]:
            with path.open("rb") as f:
                files.append(c.files.create(file=f, purpose="fine-tune").id)
        method = {
            "type": "reinforcement",
            "reinforcement": {
                "grader": GRADER,
                "hyperparameters": {
                    "batch_size": 2,
                    "n_epochs": 200,
                    "compute_multiplier": 0.5,
                    "reasoning_effort": "low",
                },
            },
        }
        trainer = clients[0].fine_tuning.jobs.create(
            model="tiny-random", training_file=files[0], method=method
        )
        until(
            lambda: clients[0].fine_tuning.jobs.retrieve(trainer.id).status == "running",
            120,
            "the training job to run",
        )
        until(
            lambda: (
                clients[0].fine_tuning.jobs.list_events(trainer.id, limit=1).data[0].type
                == "metrics"
            ),
            180,
            "the first training step",
        )
        created: list[str] = []
        owned: list[list[str]] = [[] for _ in clients]
        for i in range(0, args.clients, 2):  # clients with key a also read the trainer
            owned[i].append(trainer.id)
        create_failures: list[str] = []
        lock = threading.Lock()

        def make(i: int) -> None:
            c = clients[i % args.clients]
            try:
                job = c.fine_tuning.jobs.create(
                    model="tiny-random",
                    training_file=files[(i % args.clients) % 2],
                    method=method,
                    suffix=f"load{i}",
                )
                with lock:
                    created.append(job.id)
                    owned[i % args.clients].append(job.id)
            except Exception as exc:
                with lock:
                    create_failures.append(f"{type(exc).__name__}: {exc}"[:200])

        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            list(pool.map(make, range(args.jobs)))
        create_s = time.perf_counter() - t0
        job_ids = [trainer.id, *created]
        t0 = time.perf_counter()
        lat, by_kind, read_failures = reads(clients, args.reads, owned, args.clients)
        reads_s = time.perf_counter() - t0
        still_running = clients[0].fine_tuning.jobs.retrieve(trainer.id).status == "running"
        steps_during = sum(
            1
            for e in clients[0].fine_tuning.jobs.list_events(trainer.id, limit=100)
            if e.type == "metrics"
        )
        listed = set(all_jobs(clients[0])) | set(all_jobs(clients[1]))
        lost = sorted(set(job_ids) - listed)
        for job_id in job_ids:
            c = clients[0] if job_id in set(all_jobs(clients[0])) else clients[1]
            c.fine_tuning.jobs.cancel(job_id)
        # Baseline after: same mix, nothing training now.
        base, _, base_fail = reads(clients, min(400, args.reads), owned, args.clients)
        result = {
            "what": "rldojo service under load on loopback (benchmarks/service_load.py)",
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "jobs_created": len(created),
            "create_failures": create_failures,
            "create_wall_s": round(create_s, 2),
            "jobs_lost": lost,
            "jobs_listed": len(listed & set(job_ids)),
            "reads": len(lat) + len(read_failures),
            "read_failures": read_failures,
            "reads_wall_s": round(reads_s, 2),
            "reads_per_s": round(len(lat) / reads_s, 1),
            "read_latency_while_training": summary(lat),
            "read_latency_by_kind": {k: summary(v) for k, v in sorted(by_kind.items())},
            "read_latency_idle_baseline": summary(base),
            "baseline_failures": base_fail,
            "p99_ratio_training_vs_idle": round(pct(lat, 0.99) / max(pct(base, 0.99), 1e-3), 2),
            "training_job_running_after_reads": still_running,
            "training_steps_logged_by_end": steps_during,
            "after": f"all {len(job_ids)} jobs cancelled after the reads to bound the run (the "
            f"{len(created)} queued jobs never trained)",
            "wall_s": round(time.perf_counter() - started, 1),
        }
        label = "dry" if args.dry else "default"
        out = write_result("service_load", label, result, out_dir=args.results, path=args.out,
                           dry=args.dry)  # fmt: skip
        print(f"wrote {out}")
        print(
            json.dumps(
                {
                    k: result[k]
                    for k in (
                        "jobs_created",
                        "jobs_lost",
                        "reads",
                        "read_failures",
                        "read_latency_while_training",
                        "read_latency_idle_baseline",
                        "p99_ratio_training_vs_idle",
                    )
                },
                indent=2,
            )
        )
        ok = not (create_failures or read_failures or lost or base_fail)
        sys.exit(0 if ok else 1)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


if __name__ == "__main__":
    main()
