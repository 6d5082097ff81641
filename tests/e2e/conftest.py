"""Fixtures of the e2e suite: one real control plane for the session (see cluster.py), a namespace per test.

Run with `pytest -m e2e tests/e2e` (the default `pytest` run excludes the `e2e` marker). The first run builds
the control plane (tests/e2e/build.sh); later runs reuse the cached binaries.

Where the control plane cannot be built or started the suite fails; the one exception is a machine without Go
and without cached binaries outside CI, where it skips and says why. On CI (CI=true) it always fails.
A failed test gets the tail of every control-plane process's log attached to its report.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from cluster import BUILD_SCRIPT, Cluster, ClusterError, running_cluster
from realnode import RealNode, build_containerd_binaries, build_node_binaries

_counter = itertools.count()
_CLUSTER: list[Cluster] = []
_NODE: list[RealNode] = []


def _on_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _cached_bin() -> Path | None:
    done = subprocess.run(["bash", str(BUILD_SCRIPT), "--print-dir"], capture_output=True, text=True, check=False)
    path = Path(done.stdout.strip()) if done.returncode == 0 and done.stdout.strip() else None
    return path if path and (path / "kube-apiserver").exists() else None


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The session's control plane with the seed's nodes and the registered webhook."""
    if shutil.which("go") is None and _cached_bin() is None and not _on_ci():
        pytest.skip("e2e: no Go toolchain to build the control plane (tests/e2e/build.sh) and no cached binaries")
    workdir = tmp_path_factory.mktemp("cluster")
    try:
        with running_cluster(workdir) as started:
            _CLUSTER.append(started)
            yield started
    except ClusterError as exc:
        pytest.fail(f"e2e control plane could not be built or started: {exc}", pytrace=False)
    finally:
        _CLUSTER.clear()


@pytest.fixture(scope="module")
def real_node(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory,
              request: pytest.FixtureRequest) -> Iterator[RealNode]:
    """OPT-IN: a real kubelet on containerd (tests/e2e/realnode.py) beside the kwok nodes, for one test module.

    Only the real-node tests ask for it. It fails (never skips) when the machine cannot run it: not root, a missing
    package, or another real node running (one at a time per machine). While it runs the kwok T4 nodes are cordoned,
    so that the seed's Pod, which the packaged rules send to an inference T4 node, lands on the real node.
    A module that sets `REAL_NODE_CDI = True` gets containerd 2.x with CDI (build_containerd.sh) instead of Debian's.
    """
    node = RealNode(cluster=cluster, bindir=Path(), workdir=tmp_path_factory.mktemp("realnode"))
    t4 = ("gpu-t4-0", "gpu-t4-1")
    try:
        node.bindir = build_node_binaries()
        if getattr(request.module, "REAL_NODE_CDI", False):
            node.containerd_bindir = build_containerd_binaries()
        node.start()
        for name in t4:
            cluster.kubectl("cordon", name)
        _NODE.append(node)
        yield node
    except ClusterError as exc:
        pytest.fail(f"e2e real node could not be built or started: {exc}", pytrace=False)
    finally:
        _NODE.clear()
        for name in t4:
            cluster.kubectl("uncordon", name, check=False)
        node.stop()


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace (its `default` ServiceAccount exists), deleted after the test."""
    base = request.node.name.split("[")[0].replace("_", "-").lower()[:40].strip("-")
    name = f"{base}-{next(_counter)}"
    cluster.ensure_namespace(name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item,
                              call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach the control plane's logs to a failed e2e test's report."""
    report = yield
    if report.failed and _CLUSTER:
        report.sections.append(("control-plane logs", _CLUSTER[0].logs()))
    if report.failed and _NODE:
        report.sections.append(("real-node logs", _NODE[0].logs()))
    return report
