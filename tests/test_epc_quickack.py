"""The kernel ACKs what Emacs sends at once (TCP_QUICKACK, Linux): Emacs keeps Nagle on
its socket, so its second small frame in a row (the return of the kernel's call, then
the next message) waited for the kernel's delayed ACK, ~40 ms (bench_emacs: reply
inserted p50 45 ms -> 3 ms)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from opencortex import epc_connection
from opencortex.epc_connection import quick_ack

pytestmark = pytest.mark.skipif(not hasattr(socket, "TCP_QUICKACK"), reason="Linux only")


class Transport:
    def __init__(self, sock):
        self.sock = sock

    def get_extra_info(self, name):
        return self.sock if name == "socket" else None


def test_quick_ack_sets_the_option_on_the_connections_socket():
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    try:
        server.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 0)
        quick_ack(Transport(server))
        assert server.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK) == 1
        quick_ack(None)                   # no transport: nothing to do, no error
    finally:
        for sock in (client, server, listener):
            sock.close()


def test_every_read_acks_at_once(monkeypatch):
    seen = []
    monkeypatch.setattr(epc_connection, "quick_ack", lambda transport: seen.append(transport))
    connection = epc_connection.KernelConnection.__new__(epc_connection.KernelConnection)
    connection.closed = False
    connection.transport = object()
    connection.frames = type("Frames", (), {"feed": lambda self, data: None,
                                            "next_frame": lambda self: None})()
    connection._handle_incoming = lambda: None
    connection.data_received(b"000001x")
    assert seen == [connection.transport]
