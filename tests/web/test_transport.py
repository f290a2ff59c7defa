"""The connection guards: a closed client is seen without waiting; a slow body gets 408."""

from __future__ import annotations

import socket

import pytest

from phi_api.web.transport import client_gone


@pytest.fixture
def pair():
    server, client = socket.socketpair()
    yield server, client
    server.close()
    client.close()


def test_a_connected_idle_client_is_not_gone(pair):
    server, _ = pair
    assert not client_gone(server)


def test_a_client_that_sent_more_bytes_is_not_gone(pair):
    server, client = pair
    client.sendall(b"GET / HTTP/1.1\r\n")
    assert not client_gone(server)
    assert server.recv(100) == b"GET / HTTP/1.1\r\n"  # peeking consumed nothing


def test_a_client_that_closed_is_gone(pair):
    server, client = pair
    client.close()
    assert client_gone(server)


def test_a_closed_socket_is_gone(pair):
    server, _ = pair
    server.close()
    assert client_gone(server)


def test_a_large_chunk_of_a_stream_is_written_in_slices_each_with_its_own_deadline(pair):
    from phi_api.web.transport import STREAM_SLICE, _watched

    server, _ = pair
    large = "".join(chr(ord("a") + index % 26) for index in range(5 * STREAM_SLICE + 7))
    written = list(_watched(iter(["data: 1\n\n", large, ""]), server))
    assert written[0] == "data: 1\n\n" and written[-1] == ""
    assert "".join(written[1:-1]) == large and max(len(piece) for piece in written) <= STREAM_SLICE
    assert len(written) == 2 + 6

