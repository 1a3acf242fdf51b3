"""Free loopback ports for the local labs' servers (PostgreSQL, Patroni's REST API, etcd, Toxiproxy).

A port from ``bind(0)`` comes from the kernel's ephemeral range (``net.ipv4.ip_local_port_range``), the range every
outgoing connection on the machine draws its own port from: between the moment a lab chooses it and the moment its
server binds it, any client's connection (pgbench's, a Kubernetes lab's, a test's) can take it, and the server
fails with "Address already in use". The ports are drawn at random from below that range instead, where only
programs that choose a port themselves listen, each one checked by binding it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

HOST = "127.0.0.1"
LOWEST = 20000  # above the ports well-known servers take by default (5432, 2379, 8008, 8474, 6443, 10250, ...)
EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _pool() -> range:
    """The ports to draw from: from LOWEST to the ephemeral range's start; above its end when it starts lower;
    the kernel's choice (empty) when neither leaves room."""
    try:
        low, high = map(int, EPHEMERAL.read_text().split())
    except (OSError, ValueError):
        return range(LOWEST, 32768)  # Linux's default range starts at 32768
    if low - LOWEST >= 1000:
        return range(LOWEST, low)
    if 65535 - high >= 1000:
        return range(high + 1, 65536)
    return range(0)


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports nothing listens on (held together while chosen, so none is handed out twice)."""
    pool = _pool()
    socks: list[socket.socket] = []
    try:
        candidates = random.sample(pool, min(len(pool), 50 * n)) if pool else []
        for port in candidates:
            if len(socks) == n:
                break
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind((HOST, port))
            except OSError:
                s.close()
                continue
            socks.append(s)
        while len(socks) < n:  # the pool is full or absent: the kernel's choice
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    """One port nothing listens on (:func:`free_ports`)."""
    return free_ports(1)[0]
