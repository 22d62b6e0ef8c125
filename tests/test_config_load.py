"""load(): every source form, the readable view (checked against docs/semantics.md), the serialisations, the CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from google.protobuf import text_format

import tf_embed_ops.config as tec
from tf_embed_ops.__main__ import main

# Slots after `parameters`, in Load/Retrieve order; initial values from TF's Python optimizers.
EXPECTED_SLOTS = {
    "video": ("adam", [("momenta", 0.0), ("velocities", 0.0)]),
    "user": ("adagrad", [("accumulators", 0.1)]),
    "query": ("ftrl", [("accumulators", 0.1), ("linears", 0.0)]),
    "item": ("adagrad_momentum", [("accumulators", 0.0), ("momenta", 0.0)]),
    "category": ("stochastic_gradient_descent", []),
}


@pytest.fixture(scope="module")
def example():
    return tec.load(tec.example_config_path())


def test_example_view(example):
    assert [t.name for t in example.tables] == list(EXPECTED_SLOTS)
    for table in example.tables:
        kind, slots = EXPECTED_SLOTS[table.name]
        assert table.optimizer.kind == kind
        assert [(s.name, s.default_initial_value) for s in table.optimizer.slots] == slots
    video, user, query, item, category = example.tables
    assert (video.vocabulary_size, video.dimension) == (1000, 16)
    assert video.optimizer.hyperparameters == {
        "beta1": 0.9,
        "beta2": 0.999,
        "epsilon": 1e-07,
        "use_non_lazy_adam": False,
        "use_sum_inside_sqrt": True,
    }
    assert video.learning_rate.tag == 0 and user.learning_rate.tag == 0 and category.learning_rate.tag == 1
    assert query.learning_rate.constant == 0.05
    assert (video.gradient_clipping.lower, video.gradient_clipping.upper) == (-1.0, 1.0)
    assert (query.weight_clipping.lower, query.weight_clipping.upper) == (-0.5, 0.5)
    assert not query.gradient_clipping.active
    assert user.weight_decay_factor == 0.0001 and user.multiply_weight_decay_factor_by_learning_rate
    assert item.optimizer.hyperparameters["use_nesterov"] is True and item.optimizer.hyperparameters["epsilon"] == 1e-10
    assert not category.gradient_accumulation
    assert category.simulated_quantization == tec.QuantizationInfo(256, -1.0, 1.0)
    assert example.num_learning_rate_tags == 2
    assert example.learning_rate_tags == {0: ("video", "user"), 1: ("category",)}
    assert [(f.name, f.table_name, f.input_shape) for f in example.features][3] == ("query_tokens", "query", (32, 10))
    assert (example.mode, example.sharding_strategy, example.num_hosts) == ("TRAINING", "DIV_DEFAULT", 1)
    assert example.table_by_name("item") is item
    with pytest.raises(KeyError, match="no table named 'nope'"):
        example.table_by_name("nope")


def test_every_source_form_gives_the_same_config(example, tmp_path):
    proto = example.to_proto()
    binary = tmp_path / "c.pb"
    binary.write_bytes(proto.SerializeToString())
    text = tmp_path / "c.textproto"
    text.write_text(text_format.MessageToString(proto))
    for source in (
        proto,
        proto.SerializeToString(),
        bytearray(proto.SerializeToString()),
        str(binary),
        binary,
        text,
        example.serialize(),
        example,
    ):
        assert tec.load(source) == example


def test_serialisations_round_trip(example):
    assert tec.load(example.serialize()) == example
    assert text_format.Parse(example.to_text(), tec.TPUEmbeddingConfiguration()) == example.to_proto()
    copy = example.to_proto()
    copy.num_hosts = 5  # to_proto returns a copy: the view does not change
    assert example.to_proto().num_hosts == 1
    data = json.loads(json.dumps(example.to_dict()))
    assert [t["name"] for t in data["tables"]] == list(EXPECTED_SLOTS)
    assert data["tables"][2]["weight_clipping"] == {"lower": -0.5, "upper": 0.5}


@pytest.mark.parametrize(
    "source, message",
    [
        (123, "source: expected serialized bytes"),
        ("config.yaml", "cannot tell the format"),
        (
            tec.TPUEmbeddingConfiguration.TableDescriptor(),
            "expected a tensorflow.tpu.TPUEmbeddingConfiguration message",
        ),
    ],
)
def test_bad_sources(source, message):
    with pytest.raises(ValueError, match=message):
        tec.load(source)


def test_missing_file():
    with pytest.raises(FileNotFoundError):
        tec.load("/nonexistent/config.pbtxt")


def test_infinite_clip_bounds_read_as_open(example):
    proto = example.to_proto()
    proto.table_descriptor[0].optimization_parameters.clipping_limits.upper.value = math.inf
    table = tec.load(proto).tables[0]
    assert table.weight_clipping == tec.ClipLimits(None, None) and not table.weight_clipping.active
    json.dumps(tec.load(proto).to_dict())  # infinities stay JSON-serialisable


# ---- CLI ----


def test_cli_table(capsys):
    assert main(["inspect", "example"]) == 0
    out = capsys.readouterr().out
    for fragment in (
        "Tables (5)",
        "Features (6)",
        "adagrad_momentum",
        "momenta=0, velocities=0",
        "accumulators=0.1, linears=0",
        "tag 0",
        "query_tokens",
        "[32, 10]",
        "0    video, user",
        "quantize=256@[-1, 1]",
        "weight_decay=0.0001*lr",
        "clip_gradients=[-1, 1]",
    ):
        assert fragment in out, fragment


def test_cli_json(capsys):
    assert main(["inspect", tec.example_config_path(), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["num_learning_rate_tags"] == 2
    assert [s["name"] for s in data["tables"][0]["optimizer"]["slots"]] == ["momenta", "velocities"]


def test_cli_bad_config(tmp_path, capsys):
    path = tmp_path / "bad.pbtxt"
    path.write_text('table_descriptor { name: "t" vocabulary_size: 0 dimension: 2 }')
    assert main(["inspect", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == f"error: {path}: table 't' (table_id 0): vocabulary_size must be > 0, got 0"


@pytest.mark.slow
def test_cli_entry_point_in_a_new_process(tmp_path):
    path = tmp_path / "bad.pb"
    path.write_bytes(b"\xff\xfe garbage")
    bad = subprocess.run([sys.executable, "-m", "tf_embed_ops", "inspect", str(path)], capture_output=True, text=True)
    assert bad.returncode == 1
    assert "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines()[-1].startswith(f"error: {path}: config: could not parse")
    good = subprocess.run([sys.executable, "-m", "tf_embed_ops", "inspect", "example"], capture_output=True, text=True)
    assert good.returncode == 0 and "Tables (5)" in good.stdout
