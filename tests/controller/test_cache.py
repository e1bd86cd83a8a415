"""ClusterCache: incremental, idempotent, wakes the loop only for changes that matter."""

from __future__ import annotations

import copy

from builders import T0, gang_pods, job, node, placed_status, pod

from gpuq.controller.cache import ClusterCache


def counting_cache() -> tuple[ClusterCache, list[int]]:
    calls: list[int] = []
    return ClusterCache(on_change=lambda: calls.append(1)), calls


def test_same_object_again_does_not_wake_the_loop() -> None:
    cache, calls = counting_cache()
    body = node("n1")
    cache.upsert_node(body)
    again = copy.deepcopy(body)
    again["metadata"]["resourceVersion"] = str(int(body["metadata"]["resourceVersion"]) + 1)
    again["status"]["conditions"][0]["lastHeartbeatTime"] = "2030-01-01T00:00:00Z"  # not modelled
    cache.upsert_node(again)
    assert len(calls) == 1


def test_stale_event_does_not_overwrite_a_newer_write() -> None:
    cache, _ = counting_cache()
    old = job("a")
    new = copy.deepcopy(old)
    new["metadata"]["resourceVersion"] = str(int(old["metadata"]["resourceVersion"]) + 5)
    new["status"] = {"phase": "Queued"}
    cache.upsert_job(new)  # e.g. the response of our status patch
    cache.upsert_job(old)  # a watch event still in flight
    assert cache.jobs["team-a/a"].status.phase == "Queued"


def test_delete_of_an_older_incarnation_is_ignored() -> None:
    cache, _ = counting_cache()
    first = job("a")
    second = job("a")
    second["metadata"]["uid"] = "uid-new"
    cache.upsert_job(first)
    cache.delete_job(first)
    cache.upsert_job(second)
    cache.delete_job(first)  # late DELETED of the old object
    assert cache.jobs["team-a/a"].uid == "uid-new"


def test_unbound_foreign_pods_are_not_kept() -> None:
    cache, calls = counting_cache()
    cache.upsert_pod(pod("web", scheduler="default-scheduler"))
    assert cache.pods == {} and calls == []
    cache.upsert_pod(pod("web2", node_name="n1", scheduler="default-scheduler"))
    assert "team-a/web2" in cache.pods


def test_pods_are_indexed_by_job() -> None:
    cache, _ = counting_cache()
    for body in gang_pods("a", ["n1", "n2"]):
        cache.upsert_pod(body)
    assert [p.rank for p in cache.pods_of("team-a/a")] == [0, 1]
    cache.delete_pod(gang_pods("a", ["n1", "n2"])[0] | {"metadata": {"name": "a-1-0", "namespace": "team-a"}})
    assert [p.rank for p in cache.pods_of("team-a/a")] == [1]


def test_a_jobs_pods_come_in_key_order_however_they_arrived() -> None:
    cache, _ = counting_cache()
    bodies = gang_pods("a", [f"n{r}" for r in range(12)])  # names a-1-0 ... a-1-11: a-1-10 sorts early
    shuffled = [bodies[i] for i in (3, 0, 11, 1, 10, 2, 4, 5, 6, 7, 8, 9)]
    for body in shuffled:
        cache.upsert_pod(body)
    names = [p.name for p in cache.pods_of("team-a/a")]
    assert names == sorted(b["metadata"]["name"] for b in bodies)
    cache.delete_pod(bodies[10])
    cache.upsert_pod(copy.deepcopy(bodies[1]) | {"status": {"phase": "Failed"}})  # an update keeps its place
    again = copy.deepcopy(bodies[10])
    again["metadata"]["uid"] = "uid-again"  # made again (the deleted uid stays gone)
    cache.upsert_pod(again)  # sorting before the last
    assert [p.name for p in cache.pods_of("team-a/a")] == names
    assert cache.pods_of("team-a/a")[names.index("a-1-1")].phase == "Failed"


def test_assumption_lasts_until_the_api_records_the_attempt() -> None:
    cache, _ = counting_cache()
    cache.upsert_job(job("a"))
    cache.assume("team-a/a", 1, ("n1", "n2"), 0.0)
    cache.upsert_job(job("a", status={"phase": "Queued", "attempt": 0}))
    assert "team-a/a" in cache.assumed
    cache.upsert_job(job("a", status=placed_status(["n1", "n2"], "Admitted", attempt=1)))
    assert "team-a/a" not in cache.assumed


def test_forget_wakes_the_loop() -> None:
    cache, calls = counting_cache()
    cache.assume("team-a/a", 1, ("n1",), 0.0)
    n = len(calls)
    cache.forget("team-a/a")
    cache.forget("team-a/a")
    assert len(calls) == n + 1


def test_pods_of_an_earlier_job_with_the_same_name_are_told_apart() -> None:
    cache, _ = counting_cache()
    old_pod = gang_pods("a", ["n1"])[0]
    old_pod["metadata"]["ownerReferences"][0]["uid"] = "uid-old"
    cache.upsert_pod(old_pod)
    cache.upsert_job(job("a"))
    assert cache.pods_of("team-a/a", cache.jobs["team-a/a"].uid) == ()
    assert len(cache.pods_of("team-a/a")) == 1


def test_pods_of_deleted_jobs_are_orphans() -> None:
    cache, _ = counting_cache()
    body = job("a", status=placed_status(["n1", "n2"]))
    cache.upsert_job(body)
    for p in gang_pods("a", ["n1", "n2"]):
        cache.upsert_pod(p)
    assert cache.orphans() == []
    cache.delete_job(body)
    assert sorted(p.name for p in cache.orphans()) == ["a-1-0", "a-1-1"]
    for p in gang_pods("a", ["n1", "n2"]):
        cache.delete_pod(p)
    assert cache.orphans() == [] and cache.deleted_jobs == {}


def test_a_late_write_response_does_not_resurrect_a_deleted_pod() -> None:
    """Our DELETE's response (pod with deletionTimestamp) may arrive after the DELETED event."""
    cache, _ = counting_cache()
    body = gang_pods("a", ["n1"])[0]
    cache.upsert_pod(body)
    response = copy.deepcopy(body)
    response["metadata"]["deletionTimestamp"] = "2023-11-14T22:20:00Z"
    response["metadata"]["resourceVersion"] = str(int(body["metadata"]["resourceVersion"]) + 1)
    gone = copy.deepcopy(response)
    gone["metadata"]["resourceVersion"] = str(int(body["metadata"]["resourceVersion"]) + 2)
    cache.delete_pod(gone)
    cache.upsert_pod(response)
    assert cache.pods == {}


def test_jobs_whose_object_or_pods_changed_are_touched_until_taken() -> None:
    c = ClusterCache()
    c.upsert_job(job("a"))
    c.upsert_job(job("b"))
    assert c.take_touched() == {"team-a/a", "team-a/b"} and c.take_touched() == set()
    c.upsert_pod(pod("a-1-0", node_name="n1", job_name="a"))
    assert c.take_touched() == {"team-a/a"}
    c.upsert_job(job("b"))  # the same object again: nothing changed
    assert c.take_touched() == set()
    c.delete_pod(pod("a-1-0", node_name="n1", job_name="a"))
    assert c.take_touched() == {"team-a/a"}


def test_an_admission_made_in_a_burst_lets_its_status_wait_longer() -> None:
    from gpuq.controller.record import ADMITTED_STATUS_DELAY, BURST_GANGS, BURST_STATUS_DELAY

    cache = ClusterCache()
    for i in range(BURST_GANGS + 2):
        cache.assume(f"team-a/j{i}", 1, ("n1",), T0)
    assert cache.assumed["team-a/j0"].status_delay == ADMITTED_STATUS_DELAY
    assert cache.assumed[f"team-a/j{BURST_GANGS + 1}"].status_delay == BURST_STATUS_DELAY


def test_an_admission_decided_with_a_large_batch_is_part_of_the_burst_from_the_first() -> None:
    from gpuq.controller.record import ADMITTED_STATUS_DELAY, BURST_GANGS, BURST_STATUS_DELAY

    cache = ClusterCache()
    cache.assume("team-a/first", 1, ("n1",), T0, decided_with=BURST_GANGS + 1)
    cache.assume("team-a/small", 1, ("n1",), T0, decided_with=BURST_GANGS)
    assert cache.assumed["team-a/first"].status_delay == BURST_STATUS_DELAY
    assert cache.assumed["team-a/small"].status_delay == ADMITTED_STATUS_DELAY


def test_a_relist_parses_again_only_versions_the_cache_does_not_hold() -> None:
    # A new term lists every kind again: 100,000 pods parsed again were seconds of a takeover. An
    # object at the version the cache holds is the object it holds (the API server gives a new
    # resourceVersion to every change), so the relist keeps the entry without parsing the body.
    cache, _ = counting_cache()
    jb, pd, nd = job("a"), pod("a-1-0", node_name="n1", job_name="a"), node("n1")
    cache.replace("job", [jb], "10")
    cache.replace("pod", [pd], "10")
    cache.replace("node", [nd], "10")
    held = cache.jobs["team-a/a"], cache.pods["team-a/a-1-0"], cache.nodes["n1"]
    # The same versions with different contents (never so in a real API server): not parsed.
    same = copy.deepcopy(jb), copy.deepcopy(pd), copy.deepcopy(nd)
    same[0]["spec"]["priority"] = 7
    same[1]["status"]["phase"] = "Failed"
    same[2]["metadata"]["labels"] = {"changed": "yes"}
    for kind, body in zip(("job", "pod", "node"), same, strict=True):
        cache.replace(kind, [body], "11")
    assert (cache.jobs["team-a/a"], cache.pods["team-a/a-1-0"], cache.nodes["n1"]) == held
    assert cache.jobs["team-a/a"] is held[0] and cache.pods["team-a/a-1-0"] is held[1]
    # A new version is parsed.
    for body in same:
        body["metadata"]["resourceVersion"] = str(int(body["metadata"]["resourceVersion"]) + 1)
    for kind, body in zip(("job", "pod", "node"), same, strict=True):
        cache.replace(kind, [body], "12")
    assert cache.jobs["team-a/a"].spec is not None and cache.jobs["team-a/a"].spec.priority == 7
    assert cache.pods["team-a/a-1-0"].phase == "Failed"
    assert cache.nodes["n1"].labels == {"changed": "yes"}
