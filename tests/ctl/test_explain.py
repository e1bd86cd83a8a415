"""`gpuq explain`, `gpuq queues`, `gpuq jobs` on bodies as the API server lists them: each reason code
the core gives, what would unblock it (re-checked here by changing the cluster as suggested), and the
queue and job tables."""

from __future__ import annotations

from typing import Any

from gpuq.controller.bodies import T0, gang_pods, job, namespace, node, placed_status, queue
from gpuq.core.config import SchedulerConfig
from gpuq.core.decisions import PendingCode
from gpuq.ctl.explain import explain
from gpuq.ctl.state import State
from gpuq.ctl.tables import job_rows, queue_rows

NOW = T0 + 60  # younger than the starvation threshold: no reservations
NODES = [node(f"n{i}", rack=f"r{i // 2}") for i in range(4)]  # 2 racks x 2 nodes x 8 GPUs


def state(*bodies: dict[str, Any]) -> State:
    return State.of([*NODES, *bodies], SchedulerConfig(), NOW)


def running(name: str, nodes: list[str], queue_name: str = "q", **spec: Any) -> list[dict[str, Any]]:
    body = job(name, queue_name=queue_name, replicas=len(nodes), status=placed_status(nodes), **spec)
    return [body, *gang_pods(name, nodes)]


def section(ex: Any, title: str) -> list[str]:
    return dict(ex.sections).get(title, [])


def test_quota_exceeded_names_the_nominal_change_and_the_jobs_whose_end_would_do() -> None:
    s = state(queue("q", nominal=16), *running("big", ["n0", "n1"]), job("wait", replicas=1))
    ex = explain(s, "team-a/wait")
    assert (
        ex.code == PendingCode.QUOTA_EXCEEDED
        and ex.summary == "queue q uses 16 GPUs (nominal quota 16); this job needs 8 (24 > 16)"
    )
    unblock = section(ex, "What would unblock it")
    assert unblock[0] == "nominalGPUs of q raised to 24 (now 16)"
    assert unblock[1] == "or jobs of q finishing: team-a/big (16 GPUs)"
    assert ex.data["quota"] == {
        "nominal": 16, "used": 16, "request": 8, "cohort": None, "cohortLends": 0, "peersBorrow": 0,
        "borrowingLimit": None, "fits": False,
    }  # fmt: skip
    # As suggested: with nominal 24 the core admits it.
    assert state(
        queue("q", nominal=24), *running("big", ["n0", "n1"]), job("wait", replicas=1)
    ).admitted_next("team-a/wait")


def test_capacity_names_the_running_jobs_whose_end_lets_it_in() -> None:
    bodies = [
        *running("a", ["n0"]),
        *running("b", ["n1"]),
        *running("c", ["n2", "n3"]),
        job("wait", replicas=2),
    ]
    s = state(queue("q", nominal=64), *bodies)
    ex = explain(s, "team-a/wait")
    assert ex.code == PendingCode.INSUFFICIENT_CAPACITY
    unblock = section(ex, "What would unblock it")
    assert unblock == ["1 running job finishing: team-a/c (the core admits it without them)"]
    topo = section(ex, "Topology")
    assert topo[0] == "needs 2 workers x 8 GPUs; 4 eligible nodes"
    assert any(line.startswith("best rack: ") and "0 free GPUs" in line for line in topo)


def test_fragmented_in_one_rack() -> None:
    bodies = [
        *running("a", ["n0"]),
        *running("b", ["n2"]),
        job("wait", replicas=2, topology={"level": "rack", "mode": "Required"}),
    ]
    ex = explain(state(queue("q", nominal=64), *bodies), "team-a/wait")
    assert ex.code == PendingCode.FRAGMENTED
    assert ex.summary == "needs 2x8 GPUs in one rack; best rack has 8 free"
    # Either job's end frees a whole rack.
    assert section(ex, "What would unblock it")[0].startswith("1 running job finishing: team-a/")


def test_held_queue_and_suspended_job() -> None:
    s = state(
        queue("q", nominal=64, stopPolicy="Hold"),
        job("wait", replicas=1),
        job("off", replicas=1, suspend=True),
    )
    held = explain(s, "team-a/wait")
    assert held.code == PendingCode.HELD
    assert section(held, "What would unblock it") == ["release the queue: gpuq queue release q"]
    off = explain(s, "team-a/off")
    assert off.code == "Suspended" and section(off, "What would unblock it") == [
        "resume it: gpuq resume team-a/off"
    ]


def test_a_higher_priority_job_preempts_and_the_victim_sees_its_exposure() -> None:
    flat = [b for i in range(4) for b in running(f"low{i}", [f"n{i}"])]
    s = state(queue("q", nominal=64), *flat, job("urgent", replicas=1, priority=10), job("later", replicas=1))
    assert s.pending("team-a/urgent").code == PendingCode.WAITING_FOR_PREEMPTION  # type: ignore[union-attr]
    later = explain(s, "team-a/later")  # same priority as the running jobs: it may not preempt them
    assert later.code == PendingCode.INSUFFICIENT_CAPACITY
    assert section(later, "Preemption")[0].startswith("within q: its running jobs have priority >= 0")
    victim = explain(s, "team-a/low0")
    assert victim.phase == "Running"
    exposure = section(victim, "Preemption exposure")
    higher = "waiting job{} of q with higher priority may preempt it: team-a/urgent"
    assert exposure == [f"2 {higher.format('s')}"] or exposure[0].startswith(f"1 {higher.format('')}")
    assert section(victim, "Placement")[:2] == [
        "attempt 1: 1 worker on 1 node",
        "zone-0/block-0/r0: n0",
    ]


def test_cohort_borrowing_limit_and_exhaustion() -> None:
    qs = [queue("a", nominal=8, cohort="c", borrowingLimitGPUs=8), queue("b", nominal=16, cohort="c")]
    s = state(*qs, job("wide", queue_name="a", replicas=3))
    ex = explain(s, "team-a/wide")
    assert ex.code == PendingCode.BORROWING_LIMIT
    assert section(ex, "What would unblock it")[0] == "borrowingLimitGPUs of a raised to 16 (now 8)"
    # b runs all its quota: nothing left to lend to a beyond its own nominal.
    s2 = state(*qs, *running("bjob", ["n2", "n3"], queue_name="b"), job("two", queue_name="a", replicas=2))
    ex2 = explain(s2, "team-a/two")
    assert ex2.code == PendingCode.COHORT_EXHAUSTED
    assert section(ex2, "What would unblock it")[0] == "more nominalGPUs in cohort c (any of b)"


def test_queue_table_shows_the_cohort_tree_and_quota_figures() -> None:
    qs = [queue("a", nominal=8, cohort="c"), queue("b", nominal=16, cohort="c"), queue("solo", nominal=4)]
    s = state(*qs, *running("x", ["n0", "n1"], queue_name="a"), job("w", queue_name="b", replicas=4))
    rows = {r["name"]: r for r in queue_rows(s)}
    assert (rows["a"]["used"], rows["a"]["borrowed"], rows["a"]["lent"]) == (16, 8, 0)
    # LENT is what peers use of its quota now (issue 33: it showed what it could lend, 16).
    assert (rows["b"]["used"], rows["b"]["lent"], rows["b"]["lendable"], rows["b"]["pending"]) == (
        0,
        8,
        16,
        1,
    )
    assert rows["a"]["fairShare"] == 8.0 and rows["a"]["admitted"] == 1
    assert [r["tree"] for r in queue_rows(s)] == ["c ├─ a", "  └─ b", "solo"]


def test_job_table_in_queue_order_with_codes_and_filters() -> None:
    s = state(
        queue("q", nominal=16),
        *running("run", ["n0", "n1"]),
        job("w1", replicas=1),
        job("w2", replicas=1),
    )
    rows = job_rows(s)
    assert [(r["name"], r["position"], r["reason"]) for r in rows] == [
        ("w1", 1, "QuotaExceeded"),
        ("w2", 2, "QuotaExceeded"),
        ("run", None, None),
    ]
    assert [r["name"] for r in job_rows(s, status="running")] == ["run"]
    assert [r["name"] for r in job_rows(s, status="pending")] == ["w1", "w2"]


def test_reclaim_explains_which_peer_borrows_and_why_it_is_not_taken() -> None:
    lower_only = {"reclaimWithinCohort": "LowerPriority"}
    qs = [queue("a", nominal=8, cohort="c"), queue("b", nominal=24, cohort="c", preemption=lower_only)]
    borrower = running("big", ["n0", "n1"], queue_name="a", priority=50)  # a borrows 8 of b's quota
    fill = running("own", ["n2"], queue_name="b")
    s = state(*qs, *borrower, *fill, job("wait", queue_name="b", replicas=2))
    ex = explain(s, "team-a/wait")
    assert ex.code == PendingCode.COHORT_EXHAUSTED
    assert section(ex, "Preemption")[-1] == (
        "reclaim: a (+8) borrow, but reclaimWithinCohort LowerPriority takes only jobs below its "
        "priority 0 (theirs: 50 and up)"
    )


def test_each_blocked_reason_says_what_to_fix() -> None:
    """Jobs the scheduler never sees (condition Blocked): explain gives the operator's code and the one
    change that unblocks each."""
    bad_template = job("notemplate", replicas=1)
    bad_template["spec"]["workers"]["template"] = {"spec": {"containers": []}}
    unparsable = job("garbled", replicas=1)
    unparsable["spec"]["workers"]["replicas"] = "two"  # what a schema-less (older) CRD would let through
    s = state(
        queue("q", nominal=64),
        queue("locked", nominal=64, namespaceSelector={"matchLabels": {"team": "b"}}),
        queue("broken", nominal=-1),
        namespace("team-a", team="a"),
        job("outsider", queue_name="locked", replicas=1),
        job("badlevel", replicas=1, topology={"level": "pod", "mode": "Required"}),
        job("orphan", queue_name="broken", replicas=1),
        bad_template,
        unparsable,
    )
    expected = {
        "outsider": (
            "NamespaceNotAllowed",
            "label namespace team-a to match the namespaceSelector of GPUQueue locked, or submit to another "
            "queue",
        ),
        "badlevel": (
            "UnknownTopologyLevel",
            "spec.topology.level set to a level the cluster has: zone, block, rack, node",
        ),
        "orphan": ("QueueInvalid", "fix GPUQueue broken (kubectl edit gpuqueue broken)"),
        "notemplate": (
            "InvalidPodTemplate", "fix spec.workers.template (kubectl edit trainingjob -n team-a notemplate)"
        ),
        "garbled": ("Invalid", "fix its spec (kubectl edit trainingjob -n team-a garbled)"),
    }  # fmt: skip
    for name, (code, fix) in expected.items():
        ex = explain(s, f"team-a/{name}")
        assert (ex.code, section(ex, "What would unblock it")) == (code, [fix]), name
    assert "workers.replicas" in explain(s, "team-a/garbled").summary
    assert "nominalGPUs" in explain(s, "team-a/orphan").summary


def test_cycle_limit_is_explained_and_lifting_it_admits_the_job() -> None:
    bodies = [queue("q", nominal=64), job("one", replicas=1), job("two", replicas=1)]
    limited = State.of([*NODES, *bodies], SchedulerConfig(max_admissions_per_cycle=1), NOW)
    ex = explain(limited, "team-a/two")
    assert ex.code == PendingCode.CYCLE_LIMIT and limited.admitted_next("team-a/one")
    assert section(ex, "What would unblock it") == [
        "nothing: it is tried again next cycle (maxAdmissionsPerCycle 1 was reached)"
    ]
    assert State.of([*NODES, *bodies], SchedulerConfig(), NOW).admitted_next("team-a/two")


def preempting(name: str, nodes: list[str], preemptor: str, queue_name: str = "q") -> list[dict[str, Any]]:
    """A running gang whose status records a preemption in progress (asked to checkpoint)."""
    body, *pods = running(name, nodes, queue_name=queue_name)
    body["status"]["preemption"] = {
        "preemptor": preemptor,
        "reason": "test",
        "requestedAt": "2023-11-14T22:13:50Z",
        "deadline": "2023-11-14T22:14:50Z",
    }
    return [body, *pods]


def stopped(name: str, nodes: list[str], queue_name: str = "q") -> list[dict[str, Any]]:
    """A running gang being stopped by spec.suspend (asked to checkpoint)."""
    body, *pods = preempting(name, nodes, "suspend", queue_name=queue_name)
    body["spec"]["suspend"] = True
    return [body, *pods]


def test_a_reclaimer_waiting_for_the_borrower_it_preempted_says_so() -> None:
    """Issue 33: it said InsufficientCapacity, "no peer in cohort c runs on borrowed quota" and
    "jobs ahead of it would take the room" while the borrower's gang was checkpointing for it."""
    qs = [queue("a", nominal=16, cohort="c"), queue("b", nominal=16, cohort="c")]
    borrower = preempting("big", ["n0", "n1", "n2", "n3"], "team-a/own", queue_name="b")
    s = state(*qs, *borrower, job("own", queue_name="a", replicas=2))
    ex = explain(s, "team-a/own")
    assert ex.code == PendingCode.WAITING_FOR_PREEMPTION
    assert ex.summary == "waiting for 1 preempted gang to release GPUs"
    assert section(ex, "What would unblock it") == ["its victims releasing their GPUs: team-a/big"]


def test_a_job_alone_in_its_queue_is_not_told_of_jobs_ahead_of_it() -> None:
    """The room it needs is held by a gang being stopped (spec.suspend): nothing is ahead of it."""
    stopping = stopped("off", ["n0", "n1", "n2", "n3"])
    s = state(queue("q", nominal=64), queue("solo", nominal=64), *stopping, job("w", queue_name="solo"))
    ex = explain(s, "team-a/w")
    assert ex.code == PendingCode.INSUFFICIENT_CAPACITY
    assert section(ex, "What would unblock it") == [
        "no set of running jobs finishing lets it in on its own: gangs being evicted still hold its room "
        "(team-a/off); it fits once they are gone"
    ]
    assert section(ex, "Queue") == ["position 1 of 1 waiting in queue solo (priority 0)"]


def test_texts_count_what_they_say() -> None:
    """Issue 33: "attempt 1 on 2 node(s)" then the one node twice; "room for 7 of its 6 workers"."""
    packed = running("packed", ["n0", "n0"])
    packed[0]["spec"]["workers"]["gpusPerWorker"] = 4
    s = state(
        queue("q", nominal=64),
        queue("tight", nominal=1),
        *packed,
        job("w", queue_name="tight", gpus=1),
        job("one", queue_name="tight", replicas=1, gpus=2),
    )
    ex = explain(s, "team-a/packed")
    assert section(ex, "Placement")[:2] == [
        "attempt 1: 2 workers on 1 node",
        "zone-0/block-0/r0: n0 (2 workers)",
    ]
    assert ex.data["nodes"] == ["n0"]
    waiting = explain(s, "team-a/w")
    assert waiting.code == PendingCode.QUOTA_EXCEEDED
    assert "best cluster: cluster with 24 free GPUs, room for all its workers" in section(waiting, "Topology")
    one = section(explain(s, "team-a/one"), "Topology")
    assert one[:2] == [
        "needs 1 worker x 2 GPUs; 4 eligible nodes",
        "best cluster: cluster with 24 free GPUs, room for its worker",
    ]


def capacity_unblock(s: State, key: str) -> list[str]:
    """What explain says would unblock a job waiting for capacity."""
    ex = explain(s, key)
    assert ex.code == PendingCode.INSUFFICIENT_CAPACITY, ex.summary
    return section(ex, "What would unblock it")


RACK_R0 = {"spec": {"nodeSelector": {"gpuq.dev/rack": "r0"}, "containers": [{"name": "c", "image": "i"}]}}


def test_a_job_admitted_elsewhere_is_not_ahead_of_it() -> None:
    """Issue 33: "jobs ahead of it would take the room" named a job of another queue admitted on
    nodes the waiting job may not use (its room is held by a gang being stopped)."""
    stopping = stopped("off", ["n0", "n1"])
    s = state(
        queue("q", nominal=64),
        queue("solo", nominal=64),
        queue("other", nominal=64),
        *stopping,
        job("w", queue_name="solo", replicas=2, template=RACK_R0),
        job("x", queue_name="other", replicas=1),
    )
    assert s.admitted_next("team-a/x")  # on rack r1: no room of w's
    assert capacity_unblock(s, "team-a/w") == [
        "no set of running jobs finishing lets it in on its own: gangs being evicted still hold its room "
        "(team-a/off); it fits once they are gone"
    ]


def test_jobs_ahead_are_named_only_when_they_take_its_room() -> None:
    """When the end of the running jobs frees its room (rack r0), an earlier job of its queue takes
    part of it first: that one is named."""
    bodies = [*running("a", ["n0"]), *running("b", ["n1"]), job("first", replicas=1)]
    late = job("late", replicas=2, template=RACK_R0)
    late["metadata"]["creationTimestamp"] = "2023-11-14T22:13:30Z"  # after "first"
    s = state(queue("q", nominal=64), *bodies, *running("c", ["n2", "n3"]), late)
    assert capacity_unblock(s, "team-a/late") == [
        "no set of running jobs finishing lets it in on its own: jobs ahead of it would take the freed "
        "room first (team-a/first)"
    ]


def test_reclaim_counts_a_peers_leaving_gangs_only_if_it_borrowed_with_them() -> None:
    """A peer whose gang is being stopped but which never ran above its nominal quota returns no
    borrowed GPUs: explain says no peer borrows (the core's rule), not that its evictions return some."""
    qs = [queue("a", nominal=16, cohort="c"), queue("b", nominal=32, cohort="c"), queue("q", nominal=64)]
    stopping = stopped("off", ["n0"], queue_name="b")
    others = [*running("x", ["n1"]), *running("y", ["n2", "n3"])]
    s = state(*qs, *stopping, *others, job("w", queue_name="a", replicas=2))
    ex = explain(s, "team-a/w")
    assert ex.code == PendingCode.INSUFFICIENT_CAPACITY
    assert section(ex, "Preemption")[-1] == "reclaim: no peer in cohort c runs on borrowed quota"


def test_reclaim_waits_for_the_gangs_a_borrower_gives_back() -> None:
    """The borrower borrowed counting its leaving gang: a lender's job waits for that gang (the
    core's rule, as within a queue), and explain names it."""
    qs = [queue("a", nominal=16, cohort="c"), queue("b", nominal=16, cohort="c")]
    stopping = stopped("off", ["n0", "n1"], queue_name="b")
    s = state(
        *qs, *stopping, *running("own", ["n2", "n3"], queue_name="b"), job("w", queue_name="a", replicas=2)
    )
    ex = explain(s, "team-a/w")
    assert ex.code == PendingCode.WAITING_FOR_PREEMPTION
    assert section(ex, "What would unblock it") == ["its victims releasing their GPUs: team-a/off"]
