"""A real multi-node Ray cluster on this machine (ray.cluster_utils.Cluster): a head with no
CPU for actors and two worker nodes of 2 CPUs each, on this machine's address and ports Ray
picks, its files in a temporary folder of its own; torn down after the module."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

ray = pytest.importorskip("ray")  # the ray extra (in `make setup`'s default EXTRAS)
from ray.cluster_utils import Cluster  # noqa: E402

NODE = {"num_cpus": 2, "object_store_memory": 80 * 2**20}


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Cluster]:
    tmp = tempfile.mkdtemp(prefix="vray")  # short: Ray's socket paths
    os.makedirs(f"{tmp}/ray")
    saved = {k: os.environ.get(k) for k in ("RAY_TMPDIR", "RAY_ADDRESS")}
    os.environ["RAY_TMPDIR"] = tmp
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            **NODE,
            "num_cpus": 0,
            "temp_dir": f"{tmp}/ray",
            "include_dashboard": False,
        },
    )
    try:
        for _ in range(2):
            cluster.add_node(**NODE)
        os.environ["RAY_ADDRESS"] = cluster.address
        cluster.connect(namespace="visenv")
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
