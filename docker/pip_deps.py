"""Print the pip requirements of visenv and the given extras, read from pyproject.toml.

Used by the Dockerfiles to install dependencies in a layer of their own, which is
rebuilt only when pyproject.toml changes, not on every source edit. An extra that names
visenv's own extras (`svg = ["visenv[server]", ...]`) is expanded here, since pip would
otherwise look for a package called visenv on the index.
Usage: python docker/pip_deps.py pyproject.toml server,svg,navigation > requirements.txt
"""

import re
import sys
import tomllib

with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)["project"]
SELF = re.compile(rf"{re.escape(project['name'])}\[([^\]]*)\]\s*$")


def requirements(extras: list[str], seen: set[str]) -> list[str]:
    out = []
    for extra in extras:
        if extra in seen:
            continue
        seen.add(extra)
        for req in project["optional-dependencies"][extra]:
            own = SELF.match(req)
            out += requirements(own.group(1).split(","), seen) if own else [req]
    return out


extras = [e for e in (sys.argv[2] if len(sys.argv) > 2 else "").split(",") if e]
print("\n".join(dict.fromkeys([*project["dependencies"], *requirements(extras, set())])))
