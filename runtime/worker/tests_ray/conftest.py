"""The Ray suite's fixtures: a real local Ray cluster with token auth on loopback (cluster.py).

Run through `npm run test:ray` (scripts/test-ray.sh): it puts pytest in a network namespace of its
own with only `lo`, where Ray settles on 127.0.0.1 and no packet can leave the machine. These tests
refuse to run anywhere else.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import cluster as ray_test_cluster

CHIPS_PER_HOST = ray_test_cluster.CHIPS_PER_HOST
HOSTS = ray_test_cluster.HOSTS


def pytest_configure(config):
    if not ray_test_cluster.only_loopback():
        raise pytest.UsageError(
            "the Ray tests must run in a network namespace with only loopback: use `npm run test:ray` "
            "(scripts/test-ray.sh), never on the machine's own interfaces"
        )


@pytest.fixture(scope="session")
def channel(tmp_path_factory):
    return ray_test_cluster.make_channel(tmp_path_factory.mktemp("channel"))


@pytest.fixture(scope="session")
def catalog_path(tmp_path_factory):
    return ray_test_cluster.make_catalog(tmp_path_factory.mktemp("catalog"))


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray")
    cluster, token_file = ray_test_cluster.start(tmp)
    yield {"address": cluster.address, "token_file": token_file, "tmp": tmp}
    left = ray_test_cluster.stop(cluster)
    assert not left, f"Ray processes left after the cluster stopped: {left}"
