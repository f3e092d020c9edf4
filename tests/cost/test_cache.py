"""Tests for autoprec.cost.table's cache: the cache folder, keys, entries on disk and signatures."""

from __future__ import annotations

import json

import keras

from autoprec import cost
from autoprec.cost.table import MeasurementCache, layer_signature, model_signature


def test_default_cache_dir_reads_autoprec_then_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOPREC_CACHE_DIR", str(tmp_path / "mine"))
    assert cost.default_cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("AUTOPREC_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cost.default_cache_dir() == tmp_path / "xdg" / "autoprec"
    assert not (tmp_path / "xdg").exists()  # named, not created


def test_entries_round_trip_under_a_device_folder_and_keys_depend_on_everything(tmp_path):
    cache = MeasurementCache(tmp_path, "My GPU: RTX 4090!", {"keras": "3.0"})
    key = cache.key({"cast": "bfloat16", "elements": 1024})
    assert len(key) == 32 and cache.get(key) is None
    cache.put(key, 0.25, "cast float32<->bfloat16")
    assert cache.get(key) == 0.25
    (entry,) = (tmp_path / "costs" / "my-gpu-rtx-4090").glob("*.json")
    assert json.loads(entry.read_text()) == {"seconds": 0.25, "what": "cast float32<->bfloat16"}
    assert key == cache.key({"elements": 1024, "cast": "bfloat16"})  # order-free
    others = {
        cache.key({"cast": "float16", "elements": 1024}),
        MeasurementCache(tmp_path, "other", {"keras": "3.0"}).key({"cast": "bfloat16"}),
        MeasurementCache(tmp_path, "My GPU: RTX 4090!", {"keras": "3.1"}).key({"cast": "bf"}),
    }
    assert key not in others and len(others) == 3


def test_unreadable_entries_and_no_folder_read_as_missing(tmp_path):
    cache = MeasurementCache(tmp_path, "cpu", {})
    key = cache.key({"what": 1})
    cache.put(key, 1.0, "one")
    (tmp_path / "costs" / "cpu" / f"{key}.json").write_text("{not json")
    assert cache.get(key) is None
    off = MeasurementCache(None, "cpu", {})
    off.put(key, 1.0, "one")
    assert off.directory is None and off.get(key) is None


def test_layer_signature_ignores_name_and_dtype_and_keeps_shapes(mlp):
    trace = cost.trace_model(mlp)
    dense = mlp.get_layer("dense")
    signature = layer_signature(dense, trace.calls["dense"][0], 32)
    assert signature["class"].endswith("Dense") and signature["batch_size"] == 32
    assert "name" not in signature["config"] and "dtype" not in signature["config"]
    assert signature["config"]["units"] == 16
    assert signature["arguments"] == [["inputs", {"tensor": [[None, 8], "float32"]}]]
    renamed = keras.layers.Dense(16, activation="relu", name="other", dtype="mixed_bfloat16")
    renamed.build((None, 8))
    assert layer_signature(renamed, trace.calls["dense"][0], 32) == signature
    assert layer_signature(dense, trace.calls["dense"][0], 64) != signature


def test_model_signature_is_plain_json_of_the_config(mlp):
    signature = model_signature(mlp)
    assert json.loads(json.dumps(signature)) == signature
    assert signature["name"] == "mlp"
    assert model_signature(mlp) == model_signature(mlp)
