"""The leader shows on its Lease the API user it runs as (for `gpuq doctor`'s RBAC check): learnt
from a SelfSubjectReview, written with every take and renewal, dropped on release."""

from __future__ import annotations

from aiohttp.test_utils import TestServer
from fakeapi import FakeApi, Reply, client

from gpuq.api import meta
from gpuq.controller.leader import LeaderElector, LeaseConfig, whoami

REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/gpuq-system/leases"


async def test_whoami_asks_the_api_server(fake: FakeApi, server: TestServer) -> None:
    info = {"username": "gpuq-admin", "groups": ["system:masters", "system:authenticated"]}
    fake.on("POST", REVIEWS, Reply(201, {"status": {"userInfo": info}}))
    async with client(server) as api:
        assert await whoami(api) == ("gpuq-admin", ("system:masters", "system:authenticated"))
    assert fake.requests("POST", REVIEWS)[0].body["kind"] == "SelfSubjectReview"


async def test_whoami_is_none_when_the_server_will_not_say(fake: FakeApi, server: TestServer) -> None:
    fake.on("POST", REVIEWS, Reply(403, {"reason": "Forbidden"}))
    async with client(server) as api:
        assert await whoami(api) is None


async def test_the_lease_carries_the_holders_user_and_a_release_drops_it(
    fake: FakeApi, server: TestServer
) -> None:
    fake.on("POST", LEASES, Reply(201, {"metadata": {"name": "gpuq-operator", "resourceVersion": "1"}}))
    cfg = LeaseConfig(
        identity="me", user="system:serviceaccount:gpuq-system:gpuq-operator", groups=("a", "b")
    )
    async with client(server) as api:
        elector = LeaderElector(api, cfg)
        assert await elector._try_take()
        taken = fake.requests("POST", LEASES)[0].body["metadata"]["annotations"]
        assert taken == {meta.ANNOTATION_LEADER_USER: cfg.user, meta.ANNOTATION_LEADER_GROUPS: "a,b"}
        released = elector._body("", 1, None, 0, "1")
        assert "annotations" not in released["metadata"]
        unknown = LeaderElector(api, LeaseConfig(identity="me"))._body("me", 15, None, 0, "1")
        assert "annotations" not in unknown["metadata"]
