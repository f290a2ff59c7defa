"""The host's prepacked model file: keyed by host, made once even by racing workers, checked before use."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import numpy as np
import pytest

from phi_api.engine.runtime import prepack
from phi_api.engine.runtime.pool import KVPool
from phi_api.engine.runtime.session import Decoder
from phi_api.engine.runtime.spec import DecoderSpec


def logits_of(model_file: Path, folder: Path) -> np.ndarray:
    decoder = Decoder(model_file, DecoderSpec.read(folder), threads=1)
    kv = KVPool(decoder.spec, 1, 32)
    return decoder.step(kv, 0, np.arange(3, 19, dtype=np.int64)[None, :], np.array([0]), True).copy()


def test_the_prepacked_file_gives_the_original_s_logits_bit_for_bit(model_path, tmp_path):
    source = Path(model_path)
    made = prepack.prepacked_model(source, "model.onnx", tmp_path)
    assert made.parent.parent == tmp_path and (made.parent / prepack.DATA_FILE).is_file()
    assert np.array_equal(logits_of(made, source), logits_of(source / "model.onnx", source))
    assert [entry.name for entry in tmp_path.iterdir() if entry.name.startswith(".staging")] == []


def test_another_cpu_or_onnxruntime_never_uses_this_host_s_file(model_path, monkeypatch):
    source = Path(model_path)
    here = prepack.host_key(source, "model.onnx")
    monkeypatch.setattr(prepack, "cpu_features", lambda: "GenuineIntel|Xeon|avx512f amx_tile")
    other_cpu = prepack.host_key(source, "model.onnx")
    monkeypatch.setattr("onnxruntime.__version__", "9.9.9")
    other_runtime = prepack.host_key(source, "model.onnx")
    assert len({here, other_cpu, other_runtime}) == 3


def _make_in_process(arguments: tuple[str, str]) -> str:
    source, cache = arguments
    return str(prepack.prepacked_model(Path(source), "model.onnx", Path(cache)))


def test_workers_starting_together_make_it_once(model_path, tmp_path):
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        paths = pool.map(_make_in_process, [(model_path, str(tmp_path))] * 3)
    assert len(set(paths)) == 1
    folders = [entry for entry in tmp_path.iterdir() if entry.is_dir()]
    assert folders == [Path(paths[0]).parent]  # one folder, no staging left behind


def test_a_copy_that_computes_otherwise_is_marked_unusable_and_the_original_is_served(model_path, tmp_path,
                                                                                      monkeypatch, caplog):
    save = prepack._save_prepacked

    def broken(model: Path, folder: Path, custom_ops: str) -> None:
        save(model, folder, custom_ops)
        with open(folder / prepack.DATA_FILE, "r+b") as data:  # damage every weight's first bytes
            data.seek(0)
            data.write(b"\x7f" * (1 << 20))

    monkeypatch.setattr(prepack, "_save_prepacked", broken)
    source = Path(model_path)
    served = prepack.prepacked_model(source, "model.onnx", tmp_path)
    assert served == source / "model.onnx"
    (folder,) = [entry for entry in tmp_path.iterdir() if entry.is_dir()]
    assert (folder / prepack.UNUSABLE).is_file() and not (folder / prepack.DATA_FILE).exists()
    assert "gave other results than the original" in caplog.text
    monkeypatch.setattr(prepack, "_save_prepacked", lambda *args: pytest.fail("made again"))
    assert prepack.prepacked_model(source, "model.onnx", tmp_path) == source / "model.onnx"  # remembered


def test_making_the_copy_says_so_when_it_starts_and_when_it_ends(model_path, tmp_path, caplog):
    with caplog.at_level("INFO", logger="phi_api.engine.runtime.prepack"):
        prepack.prepacked_model(Path(model_path), "model.onnx", tmp_path)
        prepack.prepacked_model(Path(model_path), "model.onnx", tmp_path)  # made: nothing to say
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2
    assert messages[0].startswith(f"prepacking {model_path} for this host") and "written to" in messages[1]
