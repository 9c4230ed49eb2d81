"""Several machines on one, for the tests and benches of a multi-host contact center: each host a
Linux network namespace with an address of its own, joined by a bridge to this machine (where
Kamailio, the database and the phones live), so what one host binds, the others cannot reach
except over the network. Where the machine allows no namespaces (not root, or no `ip`), each host
is a loopback address of its own instead.

Killing a host is kill -9 of its processes (the caller's part) and `isolate`: its link goes down,
so packets to it vanish as they would for a machine that lost power."""

from __future__ import annotations

import os
import shutil
import subprocess

NET_PREFIX = "10.231"  # 10.231.N.0/24: N from the process id, so two runs never share a bridge
LOOPBACK_PREFIX = "127.231"


class HostNetworkError(RuntimeError):
    pass


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if done.returncode != 0:
        raise HostNetworkError(f"ip {' '.join(args)}: {done.stderr.strip()}")


class HostNetwork:
    def __init__(self, hosts: int):
        if not 1 <= hosts <= 200:
            raise ValueError("1 to 200 hosts")
        self.hosts = hosts
        self.n = os.getpid() % 250 + 1
        self.namespaces: list[str] = []
        self.bridge = f"ccbr{self.n}"
        self.gateway = ""  # this machine's address on the hosts' network
        self.addresses: list[str] = []  # each host's own
        self.subnet = ""

    @property
    def isolated(self) -> bool:
        """Real namespaces (True) or loopback addresses (False)?"""
        return bool(self.namespaces)

    def start(self) -> "HostNetwork":
        if os.geteuid() == 0 and shutil.which("ip"):
            try:
                self._namespaces()
                return self
            except HostNetworkError:
                self.close()
        base = f"{LOOPBACK_PREFIX}.{self.n}"
        self.gateway, self.subnet = f"{base}.1", f"{base}.0/24"
        self.addresses = [f"{base}.{i + 2}" for i in range(self.hosts)]
        return self

    def _namespaces(self) -> None:
        base = f"{NET_PREFIX}.{self.n}"
        self.gateway, self.subnet = f"{base}.1", f"{base}.0/24"
        self.close()  # what a killed run with the same number left
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i in range(self.hosts):
            ns, outside, inside = f"cc{self.n}h{i}", f"ccv{self.n}h{i}", f"ccp{self.n}h{i}"
            _ip("netns", "add", ns)
            self.namespaces.append(ns)
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", ns)
            _ip("link", "set", outside, "master", self.bridge, "up")
            address = f"{base}.{i + 2}"
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", inside)
            _ip("-n", ns, "link", "set", inside, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            self.addresses.append(address)

    def prefix(self, host: int) -> list[str]:
        """What runs a command on host `host`."""
        return ["ip", "netns", "exec", self.namespaces[host]] if self.namespaces else []

    def isolate(self, host: int) -> None:
        """Take host `host` off the network (a no-op on loopback addresses)."""
        if self.namespaces:
            _ip("link", "set", f"ccv{self.n}h{host}", "down")

    def close(self) -> None:
        if os.geteuid() != 0 or not shutil.which("ip"):
            return
        names = self.namespaces or [f"cc{self.n}h{i}" for i in range(self.hosts)]
        for i, ns in enumerate(names):
            for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            subprocess.run(["ip", "link", "del", f"ccv{self.n}h{i}"], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        self.namespaces = []
