"""A real multi-node Ray cluster on this machine, for tests, benchmarks and trying
`visenv ray` without one (`pip install 'visenv[ray]'`):

    with local_ray_cluster(nodes=2, cpus_per_node=2) as cluster:
        servers.up(servers.SetSpec("envs"), 2)      # RAY_ADDRESS points at it meanwhile

A head with no CPU for actors and `nodes` worker nodes (ray.cluster_utils.Cluster), on
this machine's address and ports Ray picks, its files in a temporary folder of its own
(short: Ray's socket paths); this process is connected in the `visenv` namespace. Torn
down after, the folder removed and RAY_ADDRESS / RAY_TMPDIR as they were.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import ray
from ray.cluster_utils import Cluster

from visenv.ray_names import NAMESPACE


@contextmanager
def local_ray_cluster(nodes: int = 2, cpus_per_node: float = 2) -> Iterator[Cluster]:
    tmp = tempfile.mkdtemp(prefix="vray")
    os.makedirs(f"{tmp}/ray")
    saved = {k: os.environ.get(k) for k in ("RAY_TMPDIR", "RAY_ADDRESS")}
    os.environ["RAY_TMPDIR"] = tmp
    node = {"num_cpus": cpus_per_node, "object_store_memory": 80 * 2**20}
    head = {**node, "num_cpus": 0, "temp_dir": f"{tmp}/ray", "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        for _ in range(nodes):
            cluster.add_node(**node)
        os.environ["RAY_ADDRESS"] = cluster.address
        cluster.connect(namespace=NAMESPACE)
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
