"""Strict task-address and TF_CONFIG parsing in `python -m tf_embed_ops.distribute.server` (fast: no server)."""

from __future__ import annotations

import json

import pytest

from tf_embed_ops.distribute.server import (
    check_task_address,
    is_loopback_address,
    main,
    parse_address,
    parse_tf_config,
)

GOOD = [
    ("localhost:2222", "localhost", 2222, True),
    ("LocalHost:1", "LocalHost", 1, True),
    ("localhost.:2222", "localhost.", 2222, True),
    ("127.0.0.1:65535", "127.0.0.1", 65535, True),
    ("127.255.0.3:80", "127.255.0.3", 80, True),
    ("[::1]:2222", "::1", 2222, True),
    ("[0:0:0:0:0:0:0:1]:2222", "0:0:0:0:0:0:0:1", 2222, True),
    ("[::ffff:127.0.0.1]:2222", "::ffff:127.0.0.1", 2222, True),
    ("[fe80::1%eth0]:2222", "fe80::1%eth0", 2222, False),
    ("[2001:db8::1]:2222", "2001:db8::1", 2222, False),
    ("[::]:2222", "::", 2222, False),
    ("0.0.0.0:2222", "0.0.0.0", 2222, False),
    ("203.0.113.9:2222", "203.0.113.9", 2222, False),
    ("host1:2222", "host1", 2222, False),
    ("ps-0.train.example.com:2222", "ps-0.train.example.com", 2222, False),
    ("localhost.example.com:2222", "localhost.example.com", 2222, False),
    ("127.0.0.1.example.com:2222", "127.0.0.1.example.com", 2222, False),
    ("127.1:2222", "127.1", 2222, False),  # a name (resolvers read it as 127.0.0.1): not a loopback literal
]

BAD = [
    ("[::1].example.invalid:2222", "not 'host:port'"),
    ("[::1]@203.0.113.9:2222", "not 'host:port'"),
    ("[::1]:2222@203.0.113.9", "not 'host:port'"),
    ("[::1]:2222/x", "not 'host:port'"),
    ("[::1]", "not 'host:port'"),
    ("[::1]:", "not 'host:port'"),
    ("[[::1]]:2222", "not 'host:port'"),
    ("[127.0.0.1]:2222", "is not an IPv6 address"),
    ("[localhost]:2222", "is not an IPv6 address"),
    ("::1", "not 'host:port'"),
    ("::1:2222", "not 'host:port'"),
    ("localhost", "not 'host:port'"),
    ("localhost:", "not 'host:port'"),
    ("localhost:0", "port 0 is not in"),
    ("localhost:65536", "port 65536 is not in"),
    ("localhost:123456", "not 'host:port'"),
    ("localhost:-1", "not 'host:port'"),
    ("localhost:22 22", "not 'host:port'"),
    ("localhost :2222", "neither an IPv4 address nor a host name"),
    (" localhost:2222", "neither an IPv4 address nor a host name"),
    ("localhost:2222\n", "not 'host:port'"),
    ("user@localhost:2222", "neither an IPv4 address nor a host name"),
    ("127.0.0.1@203.0.113.9:2222", "neither an IPv4 address nor a host name"),
    ("localhost/x:2222", "neither an IPv4 address nor a host name"),
    ("-host:2222", "neither an IPv4 address nor a host name"),
    ("host-:2222", "neither an IPv4 address nor a host name"),
    ("a..b:2222", "neither an IPv4 address nor a host name"),
    ("a" * 64 + ":2222", "neither an IPv4 address nor a host name"),
    ("localhost:٣", "not 'host:port'"),  # a non-ASCII digit
    ("", "not 'host:port'"),
]


@pytest.mark.parametrize(("address", "host", "port", "loopback"), GOOD)
def test_good_addresses_parse_and_are_classified(address, host, port, loopback):
    assert parse_address(address) == (host, port)
    assert is_loopback_address(address) is loopback


@pytest.mark.parametrize(("address", "match"), BAD)
def test_bad_addresses_are_refused_naming_the_address(address, match):
    with pytest.raises(ValueError, match=match) as info:
        parse_address(address)
    assert repr(address) in str(info.value)
    assert is_loopback_address(address) is False


@pytest.mark.parametrize("address", [a for a, _ in BAD])
def test_a_malformed_address_is_refused_even_on_a_trusted_network(address):
    tf_config = {"cluster": {"ps": [address]}, "task": {"type": "ps", "index": 0}}
    with pytest.raises(ValueError, match="task address"):
        check_task_address(tf_config, trusted_network=True)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ("{not json", r"TF_CONFIG is not valid JSON \(.* at line 1 column 2\)"),
        ("", "TF_CONFIG is not valid JSON"),
        ("[1, 2]", "TF_CONFIG must be a JSON object; got list"),
        ('{"cluster": [], "task": {"type": "ps"}}', "'cluster' must be an object"),
        ('{"cluster": {"ps": "localhost:1"}, "task": {"type": "ps"}}', "job 'ps' must be a list of address strings"),
        ('{"cluster": {"ps": [1]}, "task": {"type": "ps"}}', "job 'ps' must be a list of address strings"),
        ('{"cluster": {"ps": ["localhost:1"]}, "task": "ps"}', "'task' must be an object with a string 'type'"),
        ('{"cluster": {"ps": ["localhost:1"]}, "task": {"type": "ps", "index": "0"}}', "'index' must be an int"),
        ('{"cluster": {"ps": ["localhost:1"]}, "task": {"type": "ps", "index": -1}}', "'index' must be an int >= 0"),
        ('{"cluster": {"ps": ["localhost:1"]}, "task": {"type": "ps", "index": true}}', "'index' must be an int"),
    ],
)
def test_a_malformed_tf_config_is_refused_with_a_message(raw, match):
    with pytest.raises(ValueError, match=match):
        parse_tf_config(raw)


@pytest.mark.parametrize(
    "raw",
    [
        "{not json",
        '{"cluster": {"ps": ["[::1].example.invalid:2222"]}, "task": {"type": "ps", "index": 0}}',
        '{"cluster": {"ps": ["localhost:1"]}, "task": {"type": "ps", "index": "x"}}',
    ],
)
def test_the_server_module_reports_a_bad_tf_config_without_a_traceback(raw, capsys, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", raw)
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err


def test_the_server_module_accepts_a_good_loopback_config(monkeypatch):
    started = []

    class _Joined:
        target = "grpc://localhost:1"

        def join(self):
            return None

    monkeypatch.setattr(
        "tf_embed_ops.distribute.server.start_server",
        lambda tf_config, trusted_network: started.append(tf_config) or _Joined(),
    )
    tf_config = {"cluster": {"ps": ["[::1]:2222"]}, "task": {"type": "ps", "index": 0}}
    assert main(["--tf-config", json.dumps(tf_config)]) == 0
    assert started == [tf_config]
