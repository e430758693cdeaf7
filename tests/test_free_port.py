"""`free_port` hands out ports that no outgoing connection can take meanwhile."""

from __future__ import annotations

import socket
from pathlib import Path

from pvwire_dev.ioc import free_port


def test_ports_are_below_the_ephemeral_range_and_free_for_tcp_and_udp() -> None:
    ephemeral_start = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert len(ports) > 1  # chosen at random, not one fixed port
    for port in ports:
        assert 10_000 <= port < ephemeral_start
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
            tcp.bind(("127.0.0.1", port))
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.bind(("127.0.0.1", port))
