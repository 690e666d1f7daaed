"""A result stream that cannot bind says which setting chose the address: real sockets
holding the port, the publisher itself and `edge-agent run` as a process."""

from __future__ import annotations

import socket

import pytest
from conftest import agent_command, free_endpoint, run_process

from edge_agent.pipelines.publish import ZmqPublisher


def test_a_port_held_by_another_agent_names_the_setting_and_the_likely_cause():
    first = ZmqPublisher(free_endpoint())
    first.open()  # the other agent, already running
    try:
        second = ZmqPublisher(first.endpoint)
        with pytest.raises(OSError) as e:
            second.open()
    finally:
        first.close()
    message = str(e.value)
    assert message.startswith(f"cannot bind result stream to {first.endpoint}: Address already in use")
    assert "publish.endpoint" in message and "EDGE_AGENT__PUBLISH__ENDPOINT" in message, message
    assert "another edge-agent already running" in message, message


def test_only_a_bind_error_names_the_endpoint_setting(tmp_path):
    """A CURVE key problem fails the same open: it must not send the user to the endpoint."""
    key = tmp_path / "server.key_secret"
    key.write_text("not a certificate\n")
    clients = tmp_path / "clients"
    clients.mkdir()
    pub = ZmqPublisher(free_endpoint(), curve_server_key=str(key), curve_clients_dir=str(clients))
    with pytest.raises(OSError) as e:
        pub.open()
    assert "publish.endpoint" not in str(e.value), e.value
    bad = ZmqPublisher("tcp://127.0.0.1:notaport")  # a bind error other than a port in use
    with pytest.raises(OSError) as e:
        bad.open()
    assert "(the address is publish.endpoint, or EDGE_AGENT__PUBLISH__ENDPOINT)" in str(e.value), e.value


def test_run_on_a_port_in_use_exits_with_the_setting_named(tmp_path):
    with socket.socket() as held:  # any program listening on the port
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        cfg = tmp_path / "a.yaml"
        cfg.write_text(f"metrics: {{enabled: false}}\npublish: {{endpoint: 'tcp://127.0.0.1:{port}'}}\n")
        out = run_process(agent_command("run", "--config", str(cfg), "--quiet"), timeout_s=90)
    assert out.returncode != 0, out.stderr
    assert f"cannot bind result stream to tcp://127.0.0.1:{port}: Address already in use" in out.stderr
    assert "set publish.endpoint (or EDGE_AGENT__PUBLISH__ENDPOINT) to a free port" in out.stderr, out.stderr
