"""Fixtures of the cluster client's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.kube_replay import ReplayServer


@pytest.fixture
def server() -> Iterator[ReplayServer]:
    """A replayed API server on loopback, routes set by each test."""
    with ReplayServer() as replay:
        yield replay
