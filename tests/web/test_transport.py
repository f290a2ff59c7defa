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
