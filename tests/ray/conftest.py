"""A real multi-node Ray cluster on this machine (env_server/testing/ray_cluster.py): a head
with no CPU for actors and two worker nodes of 2 CPUs each; torn down after the module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("ray")  # the ray extra (in `make setup`'s default EXTRAS)
from ray.cluster_utils import Cluster  # noqa: E402

from env_server.testing.ray_cluster import local_ray_cluster  # noqa: E402


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Cluster]:
    with local_ray_cluster(nodes=2, cpus_per_node=2) as cluster:
        yield cluster
