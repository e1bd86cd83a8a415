"""Fixtures shared by the controller tests that talk to the scripted fake API server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestServer
from fakeapi import FakeApi, serve


@pytest.fixture
def fake() -> FakeApi:
    return FakeApi()


@pytest.fixture
async def server(fake: FakeApi) -> AsyncIterator[TestServer]:
    async for s in serve(fake):
        yield s
