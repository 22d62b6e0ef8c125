"""The server entry point refuses non-loopback addresses unless the network is declared trusted (fast tier: no
server is started; a refused address is rejected before TensorFlow's server exists)."""

from __future__ import annotations

import json

import pytest

from tf_embed_ops.distribute.server import check_task_address, is_loopback_address, main, start_server

PUBLIC = {"chief": ["10.1.2.3:2222"], "ps": ["10.1.2.4:2222", "203.0.113.9:2222"], "worker": ["host1:2222"]}


@pytest.mark.parametrize(
    "address,loopback",
    [
        ("localhost:2222", True),
        ("LOCALHOST:1", True),
        ("127.0.0.1:2222", True),
        ("127.8.9.10:5", True),
        ("[::1]:2222", True),
        ("::1", False),  # a task address needs a port (and IPv6 needs brackets): refused, so not loopback
        ("0.0.0.0:2222", False),
        ("10.0.0.5:2222", False),
        ("203.0.113.9:2222", False),
        ("[::]:2222", False),
        ("[2001:db8::1]:2222", False),
        ("host1:2222", False),
        ("localhost.example.com:2222", False),
        ("127.0.0.1.evil.com:2222", False),
        ("", False),
    ],
)
def test_is_loopback_address(address, loopback):
    assert is_loopback_address(address) is loopback


@pytest.mark.parametrize(
    "task,address", [({"type": "ps", "index": 1}, "203.0.113.9:2222"), ({"type": "worker", "index": 0}, "host1:2222")]
)
def test_start_server_refuses_a_public_address_naming_it_and_the_flag(task, address):
    with pytest.raises(ValueError, match=rf"'{address}'.*--trusted-network"):
        start_server({"cluster": PUBLIC, "task": task})


def test_check_accepts_loopback_and_trusted_networks():
    local = {"cluster": {"ps": ["127.0.0.1:2"], "worker": ["localhost:3"]}, "task": {"type": "ps", "index": 0}}
    check_task_address(local, trusted_network=False)
    check_task_address({"cluster": PUBLIC, "task": {"type": "ps", "index": 0}}, trusted_network=True)


def test_check_rejects_a_task_without_an_address():
    with pytest.raises(ValueError, match="no address for task 'ps' index 2"):
        check_task_address({"cluster": PUBLIC, "task": {"type": "ps", "index": 2}}, trusted_network=True)


def test_server_module_refuses_a_public_address_without_the_flag(capsys):
    tf_config = json.dumps({"cluster": PUBLIC, "task": {"type": "ps", "index": 0}})
    assert main(["--tf-config", tf_config]) == 2
    err = capsys.readouterr().err
    assert "'10.1.2.4:2222'" in err and "--trusted-network" in err and "unauthenticated" in err


def test_server_module_refuses_a_public_address_from_the_environment(monkeypatch, capsys):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": PUBLIC, "task": {"type": "worker", "index": 0}}))
    assert main([]) == 2
    assert "'host1:2222'" in capsys.readouterr().err


def test_server_module_with_the_flag_passes_the_address_check(monkeypatch):
    started = []
    monkeypatch.setattr(
        "tf_embed_ops.distribute.server.start_server",
        lambda tf_config, trusted_network: started.append(trusted_network) or _Joined(),
    )
    tf_config = json.dumps({"cluster": PUBLIC, "task": {"type": "ps", "index": 0}})
    assert main(["--tf-config", tf_config, "--trusted-network"]) == 0
    assert started == [True]


class _Joined:
    target = "grpc://10.1.2.4:2222"

    def join(self):
        return None
