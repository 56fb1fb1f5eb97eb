"""The EPC port against a hostile local client: raw sockets on 127.0.0.1.

The real `KernelEpcServer` runs in this process (its own asyncio loop on a
thread) with a small method table, so limits can be set small and log lines
captured.  What connections, children and other users can see of the real
kernel is in test_epc_isolation.py.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest
from epc.client import EPCClient
from epc.handler import encode_message, unpack_message
from sexpdata import Symbol

from epc_loop import LoopServer
from opencortex.epc import current_connection
from opencortex.epc_connection import INLINE_DECODE_BYTES
from opencortex.epc_frames import HEAD_BYTES, FrameError, frame_length

SECRET = "the-right-secret"
BLOB = "b" * (16 << 10)


class InProcessServer(LoopServer):
    """A KernelEpcServer on its own loop thread, with methods a test can reason about."""

    def __init__(self, **options):
        self.connected: list = []
        self.noted: list[str] = []
        super().__init__(SECRET, self.methods(), **options, on_connect=self.connected.append)

    def methods(self):
        async def ping(value):
            return value

        async def blob():
            return BLOB

        async def whose():
            return id(current_connection.get())

        async def note(text):
            self.noted.append(text[:10])
            return len(self.noted)

        return {"ping": ping, "blob": blob, "whose": whose, "note": note}


@pytest.fixture
def serve_epc():
    servers: list[InProcessServer] = []

    def launch(**options) -> InProcessServer:
        servers.append(InProcessServer(**options))
        return servers[-1]

    yield launch
    for server in servers:
        server.stop()


class RawClient:
    """A socket speaking EPC by hand: it can send anything, and need not read."""

    def __init__(self, port: int, receive_buffer: int | None = None):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.connect(("127.0.0.1", port))
        self.uid = 0

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_call(self, method: str, *args) -> int:
        self.uid += 1
        self.send_raw(encode_message("call", self.uid, Symbol(method), list(args)))
        return self.uid

    def receive(self, timeout: float = 10.0):
        """The next message as (name, uid, args), or None when the server closed."""
        deadline = time.monotonic() + timeout
        try:
            length = frame_length(self.receive_exactly(HEAD_BYTES, deadline), 16 << 20)
            return unpack_message(self.receive_exactly(length, deadline))
        except (FrameError, OSError):
            return None

    def receive_exactly(self, size: int, deadline: float) -> bytes:
        """SIZE bytes; FrameError when the server closes first, OSError past DEADLINE."""
        data = b""
        while len(data) < size:                   # each pass receives, or ends the loop
            self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                raise FrameError("closed by the server")
            data += chunk
        return data

    def call(self, method: str, *args, timeout: float = 10.0):
        """Send a call and return the next message (name, uid, args)."""
        self.send_call(method, *args)
        return self.receive(timeout)

    def authenticate(self, secret: str = SECRET):
        self.send_call("authenticate", secret)
        return self.receive()

    def closed_by_server(self, timeout: float = 10.0, max_bytes: int = 64 << 20) -> bool:
        """Whether the server closes this connection: reads (and drops) at most MAX_BYTES."""
        self.sock.settimeout(timeout)
        received = 0
        try:
            while received < max_bytes:           # bounded by MAX_BYTES and the timeout
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    return True
                received += len(chunk)
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False
        return False

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw_clients():
    clients: list[RawClient] = []

    def connect(port: int, **options) -> RawClient:
        clients.append(RawClient(port, **options))
        return clients[-1]

    yield connect
    for client in clients:
        client.close()


def wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


# --- frames ------------------------------------------------------------------

@pytest.mark.parametrize("head", [b"-00001", b"0x0010", b" 00010", b"zzzzzz", b"+0001f",
                                  b"0_0010", b"\x00" * 6])
def test_a_length_prefix_must_be_six_hex_digits(head):
    with pytest.raises(FrameError, match="6 hexadecimal digits"):
        frame_length(head, 4096)


def test_a_length_over_the_cap_is_refused_before_reading():
    assert frame_length(b"000aBc", 4096) == 0xABC
    with pytest.raises(FrameError, match="over the cap"):
        frame_length(b"001001", 4096)


@pytest.mark.parametrize("head", [b"-00001", b"zzzzzz", b"0x0010"])
def test_a_bad_length_is_refused_and_the_connection_closed(serve_epc, raw_clients, head):
    server = serve_epc(auth_timeout=60)
    client = raw_clients(server.port)
    client.send_raw(head + b"x" * 1000)
    name, _, args = client.receive()
    assert name == "epc-error" and "6 hexadecimal digits" in args[0]
    assert client.closed_by_server()


def test_a_bad_length_after_authentication_closes_the_connection(serve_epc, raw_clients):
    server = serve_epc()
    client = raw_clients(server.port)
    assert client.authenticate()[0] == "return"
    client.send_raw(b"-00001" + b"(call 5 ping (1))" * 100)
    assert client.closed_by_server()
    assert wait_until(lambda: server.server.open_connections == 0)


def test_calls_before_a_broken_frame_in_the_same_read_still_run(serve_epc, raw_clients):
    """The connection closes at the broken frame, not before the whole ones ahead of it."""
    server = serve_epc()
    client = raw_clients(server.port)
    client.authenticate()
    client.send_raw(encode_message("call", 2, Symbol("note"), ["first"]) + b"zzzzzz(x)")
    name, _, args = client.receive()
    assert name == "epc-error" and "6 hexadecimal digits" in args[0]
    assert client.closed_by_server()
    assert wait_until(lambda: server.noted == ["first"])


def test_a_big_frame_before_authentication_is_closed_without_reading_it(serve_epc, raw_clients):
    server = serve_epc(auth_timeout=60)       # the close must not wait for this deadline
    client = raw_clients(server.port)
    client.send_raw(b"ffffff" + b"(" * 100)
    name, _, args = client.receive(timeout=20)
    assert name == "epc-error" and "over the cap" in args[0]
    assert client.closed_by_server(timeout=20)


def test_an_oversized_call_after_authentication_is_drained_and_refused(serve_epc, raw_clients):
    server = serve_epc(max_payload_bytes=64 << 10)
    client = raw_clients(server.port)
    client.authenticate()
    client.send_call("ping", "x" * (200 << 10))
    name, uid, args = client.receive()
    assert (name, uid) == ("return-error", 2) and "refused: the cap is 65536" in args[0]
    assert client.call("ping", "still here")[0] == "return"


# --- before authentication ------------------------------------------------------

def test_an_idle_unauthenticated_connection_is_closed_after_the_deadline(serve_epc, raw_clients):
    server = serve_epc(auth_timeout=0.5)
    client = raw_clients(server.port)
    name, _, args = client.receive(timeout=20)
    assert name == "epc-error" and "no authentication within 0.5 seconds" in args[0]
    assert client.closed_by_server(timeout=20)
    assert wait_until(lambda: server.server.open_connections == 0)


def test_a_slow_sender_cannot_stretch_the_deadline(serve_epc, raw_clients):
    server = serve_epc(auth_timeout=0.5)
    client = raw_clients(server.port)
    frame = encode_message("call", 1, Symbol("authenticate"), [SECRET])
    sent = 0
    try:
        for byte in frame[:40]:                   # bounded: 40 bytes, 0.1 s apart
            client.send_raw(bytes([byte]))
            sent += 1
            time.sleep(0.1)
    except OSError:
        pass                                      # closed under us: what we expect
    assert sent < 40
    assert client.closed_by_server(timeout=20)


def test_only_a_few_frames_are_read_before_authentication(serve_epc, raw_clients):
    server = serve_epc(auth_timeout=60)
    client = raw_clients(server.port)
    answers = []
    for _ in range(4):
        client.send_call("ping", "hello")
        answers.append(client.receive())
    assert all(a[0] == "return-error" and "not authenticated" in a[2][0] for a in answers)
    assert client.receive()[2][0].startswith("too many messages before authentication")
    assert client.closed_by_server()


def test_methods_before_authentication_lists_only_authenticate(serve_epc, raw_clients):
    server = serve_epc()
    client = raw_clients(server.port)
    client.send_raw(encode_message("methods", 1))
    name, uid, args = client.receive()
    assert (name, uid) == ("return", 1) and [str(m[0]) for m in args[0]] == ["authenticate"]
    assert client.authenticate()[0] == "return"


def test_wrong_secrets_are_refused_closed_and_logged_a_handful_of_times(serve_epc, raw_clients,
                                                                        caplog):
    caplog.set_level(logging.DEBUG)
    server = serve_epc()
    for attempt in range(1000):
        client = RawClient(server.port)
        try:
            client.send_call("authenticate", f"guess-{attempt}")
            name, _, args = client.receive()
            assert name == "return-error" and args[0].startswith("authentication failed")
            assert client.closed_by_server()
        finally:
            client.close()
    lines = [r for r in caplog.records if r.name.startswith("opencortex")]
    assert 1 <= len(lines) <= 3, [r.getMessage() for r in lines]
    assert "guess-" not in caplog.text and SECRET not in caplog.text
    assert wait_until(lambda: server.server.open_connections == 0)
    good = raw_clients(server.port)
    assert good.authenticate()[0] == "return"


# --- connections --------------------------------------------------------------

def test_connections_beyond_the_cap_are_refused_at_once(serve_epc, raw_clients):
    server = serve_epc(max_connections=3, auth_timeout=60)
    held = [raw_clients(server.port) for _ in range(3)]
    assert held[0].authenticate()[0] == "return"
    assert wait_until(lambda: server.server.open_connections == 3)
    extra = raw_clients(server.port)
    name, _, args = extra.receive()
    assert name == "epc-error" and "3 connections open already" in args[0]
    assert extra.closed_by_server()
    held[1].close()
    assert wait_until(lambda: server.server.open_connections == 2)
    again = raw_clients(server.port)
    assert again.authenticate()[0] == "return"
    assert held[0].call("ping", 1)[0] == "return"


def test_a_client_that_never_reads_is_dropped_without_stalling_others(serve_epc, raw_clients,
                                                                      caplog):
    server = serve_epc(max_payload_bytes=64 << 10, send_queue_bytes=256 << 10)
    hostile = raw_clients(server.port, receive_buffer=4096)
    assert hostile.authenticate()[0] == "return"
    good = EPCClient(("127.0.0.1", server.port))
    try:
        assert good.call_sync("authenticate", [SECRET], timeout=10) is True
        flood = threading.Thread(target=send_calls, args=(hostile, "blob", 3000), daemon=True)
        flood.start()
        for i in range(20):                       # round trips while the flood runs; a
            assert good.call_sync("ping", [i], timeout=10) == i   # stalled server never answers
        flood.join(60)
        assert not flood.is_alive()
        assert wait_until(lambda: len(server.server.clients) == 1, timeout=30)
        assert good.call_sync("ping", ["after"], timeout=10) == "after"
    finally:
        good.close()
    assert hostile.closed_by_server(timeout=30)
    assert sum("stopped reading" in r.getMessage() for r in caplog.records) == 1


def send_calls(client: RawClient, method: str, count: int) -> None:
    """Send COUNT calls without reading a reply; stop when the server closes."""
    try:
        for _ in range(count):
            client.send_call(method)
    except OSError:
        pass


def test_each_method_runs_with_its_own_connection(serve_epc, raw_clients):
    server = serve_epc()
    first, second = raw_clients(server.port), raw_clients(server.port)
    first.authenticate()
    second.authenticate()
    assert wait_until(lambda: len(server.connected) == 2)
    by_connection = {id(c): c for c in server.connected}
    one, two = (by_connection[client.call("whose")[2][0]] for client in (first, second))
    assert one is not two


def test_calls_start_in_the_order_sent_when_a_big_one_is_decoded_off_the_loop(serve_epc,
                                                                               raw_clients):
    """A frame over INLINE_DECODE_BYTES is decoded on a worker thread; the small calls
    sent right behind it, in the same write, still start after it."""
    server = serve_epc()
    client = raw_clients(server.port)
    client.authenticate()
    texts = [("big-%d " % i) + "x" * (INLINE_DECODE_BYTES * 2) if i % 3 == 0 else f"small-{i}"
             for i in range(12)]
    client.send_raw(b"".join(encode_message("call", 100 + i, Symbol("note"), [text])
                             for i, text in enumerate(texts)))
    answers = {client.receive()[1] for _ in texts}
    assert answers == {100 + i for i in range(12)}
    assert server.noted == [text[:10] for text in texts]


def test_answers_to_calls_the_kernel_never_made_are_dropped(serve_epc, raw_clients, caplog):
    server = serve_epc()
    client = raw_clients(server.port)
    client.authenticate()
    client.send_raw(encode_message("return", 424242, "forged")
                    + encode_message("return-error", [1, 2], "odd uid")
                    + encode_message("epc-error", 7, "x"))
    assert client.call("ping", "after")[2] == ["after"]
    assert "forged" not in caplog.text and "odd uid" not in caplog.text
