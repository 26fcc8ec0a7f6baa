"""A small client of Toxiproxy's HTTP API, and the server's start and stop through
deploy/toxiproxy/toxiproxy.sh (which builds it with `go install` the first time).

Toxics used by the network scenarios (Toxiproxy's names): `latency` (ms added per chunk),
`timeout` with timeout 0 (nothing passes, the connection stays open: a stall or, held past the
session timeout, a partition), `reset_peer` (TCP RST on every connection).
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "toxiproxy" / "toxiproxy.sh"
STREAMS = ("downstream", "upstream")  # broker → client, client → broker


def server(port: int, command: str) -> None:
    """`toxiproxy.sh start|stop` for the API on 127.0.0.1:`port`."""
    env = {**os.environ, "TOXIPROXY_PORT": str(port)}
    # the first start builds the binary: minutes on a busy 2-core machine
    done = subprocess.run(["bash", str(SCRIPT), command], env=env, capture_output=True,
                          text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"toxiproxy.sh {command}: {done.stdout}{done.stderr}")


@dataclass(frozen=True)
class Toxiproxy:
    """The API at 127.0.0.1:`port`."""

    port: int

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            text = answer.read()
        return json.loads(text) if text else None

    def proxy(self, name: str, listen_port: int, upstream_port: int) -> None:
        self._call("POST", "/proxies", {
            "name": name, "listen": f"127.0.0.1:{listen_port}",
            "upstream": f"127.0.0.1:{upstream_port}", "enabled": True,
        })

    def toxic(self, proxy: str, kind: str, stream: str, **attributes: int) -> str:
        """Add a toxic to every connection of `proxy`, current and new; returns its name."""
        name = f"{kind}-{stream}"
        self._call("POST", f"/proxies/{proxy}/toxics", {
            "name": name, "type": kind, "stream": stream, "toxicity": 1.0,
            "attributes": attributes,
        })
        return name

    def both_ways(self, proxy: str, kind: str, **attributes: int) -> None:
        for stream in STREAMS:
            self.toxic(proxy, kind, stream, **attributes)

    def clear(self, proxy: str) -> None:
        """Remove every toxic of `proxy`."""
        for toxic in self._call("GET", f"/proxies/{proxy}/toxics"):
            self._call("DELETE", f"/proxies/{proxy}/toxics/{toxic['name']}")

    def reset(self) -> None:
        """Every proxy enabled, every toxic gone."""
        self._call("POST", "/reset")
