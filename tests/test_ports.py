"""The local labs' ports: outside the kernel's ephemeral range, which outgoing connections draw from (a port from
bind(0) was taken by a client between its choice and Patroni's bind on a loaded CI: "Address already in use")."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from pglab.targets.local import ports


def test_ports_are_distinct_bindable_and_outside_the_ephemeral_range() -> None:
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    chosen = ports.free_ports(8)
    assert len(set(chosen)) == 8
    assert all(not low <= p <= high for p in chosen), (chosen, low, high)
    for p in chosen:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # free


def test_a_port_something_listens_on_is_never_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        monkeypatch.setattr(ports, "_pool", lambda: range(taken, taken + 2))  # the busy port and the next
        for _ in range(20):
            assert ports.free_ports(1) != [taken]


def test_without_room_outside_the_ephemeral_range_the_kernel_chooses(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    wide = tmp_path / "ip_local_port_range"
    wide.write_text("1024\t65535\n")
    monkeypatch.setattr(ports, "EPHEMERAL", wide)
    assert ports._pool() == range(0)
    (p,) = ports.free_ports(1)
    assert 1024 <= p <= 65535
    wide.write_text("10000\t30000\n")
    assert ports._pool() == range(30001, 65536)
