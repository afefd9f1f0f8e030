"""visenv servers as actors on a Ray cluster (`pip install 'visenv[ray]'`, `visenv ray ...`).

    from env_server.ray import servers
    servers.connect()                                   # RAY_ADDRESS, or this machine's
    servers.up(servers.SetSpec("envs", cpus_per_server=2), 2)
    servers.status("envs")                              # each server's node, address, load
    servers.scale("envs", 3); servers.down("envs")

The SDK finds a set by its name: `AsyncEnvClient("ray://envs")` (clients/discovery.py).
See docs/ray.md.
"""
