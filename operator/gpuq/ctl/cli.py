"""`gpuq queues`, `gpuq jobs`, `gpuq explain`, `gpuq stop|resume`, `gpuq queue hold|release`; the same
commands run as the kubectl plugin `kubectl gpuq ...` (console script kubectl-gpuq)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpuq.ctl.client import Client, CtlError
from gpuq.ctl.render import FORMATS, age, structured, table

QUEUE_COLUMNS = [
    ("QUEUE", "tree"), ("NOMINAL", "nominal"), ("USED", "used"), ("BORROWED", "borrowed"), ("LENT", "lent"),
    ("SHARE", "fairShare"), ("PENDING", "pending"), ("ADMITTED", "admitted"), ("STOP", "stopPolicy"),
]  # fmt: skip
QUEUE_WIDE = [
    *QUEUE_COLUMNS,
    ("LENDABLE", "lendable"),
    ("WEIGHT", "weight"),
    ("BORROW-LIMIT", "borrowingLimit"),
    ("ERROR", "error"),
]
JOB_COLUMNS = [
    ("NAMESPACE", "namespace"), ("NAME", "name"), ("QUEUE", "queue"), ("PHASE", "phase"), ("POS", "position"),
    ("REASON", "reason"), ("GPUS", "gpus"), ("AGE", "ageText"),
]  # fmt: skip
JOB_WIDE = [
    *JOB_COLUMNS,
    ("PRIORITY", "priority"),
    ("ATTEMPT", "attempt"),
    ("NODES", "nodes"),
    ("MESSAGE", "message"),
]


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    def command(name: str, help_: str, func: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = subparsers.add_parser(name, help=help_, description=help_)
        p.add_argument("--kubeconfig", help="kubeconfig path (default: $KUBECONFIG, ~/.kube/config)")
        p.add_argument("--context", help="kubeconfig context (default: the current one)")
        p.set_defaults(func=_guarded(func))
        return p

    q = command("queues", "GPU queues: quota, usage, borrowing, fair share, jobs, cohorts", _queues)
    q.add_argument("-o", "--output", choices=FORMATS, default="table")
    j = command("jobs", "TrainingJobs and opted-in Jobs/PyTorchJobs in queue order, with reason code", _jobs)
    j.add_argument("-o", "--output", choices=FORMATS, default="table")
    j.add_argument("--queue", help="only this queue's jobs")
    j.add_argument("--status", help="a phase (queued, admitted, running, ...), or pending: every waiting one")
    j.add_argument("-n", "--namespace", help="only this namespace")
    e = command(
        "explain",
        "why a job waits and what would unblock it, or where it runs and what may stop it",
        _explain,
    )
    e.add_argument("job", help="NAMESPACE/NAME (or NAME with -n)")
    e.add_argument("-n", "--namespace", default="default")
    e.add_argument("-o", "--output", choices=FORMATS, default="table")
    for name, suspend in (("stop", True), ("resume", False)):
        what = (
            "stop a job: it checkpoints, releases its GPUs and stays Suspended"
            if suspend
            else ("resume a stopped job: it rejoins its queue in its original order")
        )
        s = command(name, what, _suspender(suspend))
        s.add_argument("job", help="NAMESPACE/NAME (or NAME with -n)")
        s.add_argument("-n", "--namespace", default="default")
    qq = command("queue", "hold or release a GPUQueue's admissions", _queue)
    qq.add_argument("action", choices=("hold", "release"))
    qq.add_argument("name", help="the GPUQueue")
    qq.add_argument("--drain", action="store_true", help="hold: also evict its admitted jobs back into it")


def _guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except CtlError as exc:
            sys.stderr.write(f"gpuq {args.command}: {exc}\n")
            return exc.code

    return run


def _client(args: argparse.Namespace) -> Client:
    return Client(args.kubeconfig, args.context)


def _state(client: Client) -> Any:
    from gpuq.ctl.state import State

    bodies = [
        *client.nodes(),
        *client.queues(),
        *client.namespaces(),
        *client.jobs(),
        *client.gang_owners(),
        *client.gangs(),
        *client.pods(),
    ]
    return State.of(bodies, client.scheduler_config(), time.time())


def _queues(args: argparse.Namespace) -> int:
    from gpuq.ctl.tables import queue_rows

    rows = queue_rows(_state(_client(args)))
    _print_rows(rows, args.output, QUEUE_COLUMNS, QUEUE_WIDE, drop=("tree",))
    return 0


def _jobs(args: argparse.Namespace) -> int:
    from gpuq.ctl.tables import STATUSES, job_rows

    if args.status is not None and args.status.lower() not in STATUSES:
        raise CtlError(f"--status {args.status!r} is not one of: {', '.join(STATUSES)}", code=2)
    rows = job_rows(_state(_client(args)), args.queue, args.status)
    if args.namespace:
        rows = [r for r in rows if r["namespace"] == args.namespace]
    for r in rows:
        r["ageText"] = age(r["age"])
    _print_rows(rows, args.output, JOB_COLUMNS, JOB_WIDE, drop=("ageText",))
    return 0


def _print_rows(
    rows: list[dict[str, Any]],
    fmt: str,
    columns: Sequence[tuple[str, str]],
    wide: Sequence[tuple[str, str]],
    drop: Sequence[str],
) -> None:
    if fmt in ("json", "yaml"):
        sys.stdout.write(structured([{k: v for k, v in r.items() if k not in drop} for r in rows], fmt))
    elif not rows:
        sys.stdout.write("nothing found\n")
    else:
        sys.stdout.write(table(rows, wide if fmt == "wide" else columns))


def _key(args: argparse.Namespace) -> tuple[str, str]:
    ns, _, name = args.job.rpartition("/")
    return ns or args.namespace, name


def _explain(args: argparse.Namespace) -> int:
    from gpuq.ctl.explain import explain

    client = _client(args)
    ns, name = _key(args)
    if "." not in name:  # a TrainingJob (names of gangs of other owners are `job.NAME`, `pytorchjob.NAME`)
        client.job(ns, name)  # a readable "not found" before listing everything
    state = _state(client)
    key = f"{ns}/{name}"
    if key not in state.cache.jobs:
        what = "trainingjob" if "." not in name else "gang (an opted-in Indexed Job or PyTorchJob)"
        raise CtlError(f"{what} {key} not found")
    ex = explain(state, key)
    if args.output in ("json", "yaml"):
        sys.stdout.write(structured(ex.to_dict(), args.output))
        return 0
    head = f"{ex.job}: {ex.phase}" + (f" ({ex.code})" if ex.code else "")
    out = [head, f"  {ex.summary}"]
    for title, lines in ex.sections:
        out.append(f"{title}:")
        out.extend(f"  {line}" for line in lines)
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def _suspender(suspend: bool) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        ns, name = _key(args)
        if "." in name:  # the gang of an Indexed Job or PyTorchJob: its owner is suspended
            what = _client(args).suspend_gang_owner(ns, name, suspend)
            done = (
                "suspended: its controller deletes its pods, then it holds no GPUs"
                if suspend
                else ("resumed: its controller makes its pods, and the gang waits in its queue")
            )
            sys.stdout.write(f"{what} {done}\n")
            return 0
        _client(args).patch_job_spec(ns, name, {"suspend": suspend})
        done = "stopping: it checkpoints, then releases its GPUs" if suspend else "resumed: back in its queue"
        sys.stdout.write(f"trainingjob {ns}/{name} {done}\n")
        return 0

    return run


def _queue(args: argparse.Namespace) -> int:
    from gpuq.api.gpuqueue import StopPolicy

    if args.action == "release":
        policy = StopPolicy.NONE
    else:
        policy = StopPolicy.HOLD_AND_DRAIN if args.drain else StopPolicy.HOLD
    _client(args).patch_queue_spec(args.name, {"stopPolicy": policy.value})
    words = {
        StopPolicy.NONE: "released: admitting again",
        StopPolicy.HOLD: "held: no new admissions (running jobs keep running)",
        StopPolicy.HOLD_AND_DRAIN: "held and draining: its admitted jobs checkpoint and return to it",
    }
    sys.stdout.write(f"gpuqueue {args.name} {words[policy]}\n")
    return 0


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the kubectl plugin (kubectl finds `kubectl-gpuq` on PATH)."""
    from gpuq.cli import main

    return main(argv, prog="kubectl gpuq")
