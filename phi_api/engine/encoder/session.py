"""An encoder's ONNX Runtime session: a padded batch in, its output out (token vectors, or a reranker's logits).
Made on the thread that runs it, after the fork, as a generator's decoder is (a session made before a fork
computes on one thread in the child)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


class EncoderSession:
    """The folder's ``model.onnx`` with ``threads`` intra-op threads; it feeds the graph only the inputs it has."""

    def __init__(self, model_file: Path, inputs: tuple[str, ...], output: str, threads: int) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # Its threads spin within a call but sleep once it ends: an encoder's calls come now and then, and threads
        # left spinning after one took a core from the generator's steps (a spinning session burnt 48 ms of CPU in
        # 50 ms of idleness after a call; with the stop, 0.1 ms), while sleeping within a call cost up to 12%.
        options.add_session_config_entry("session.force_spinning_stop", "1")
        self._session = ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])
        graph_inputs = {value.name for value in self._session.get_inputs()}
        self._inputs = tuple(name for name in inputs if name in graph_inputs)
        self._output = output

    @property
    def inputs(self) -> tuple[str, ...]:
        return self._inputs

    def run(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        """The graph's output for a padded batch (``[rows, length]`` each, int64)."""
        given = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return self._session.run([self._output], {name: given[name] for name in self._inputs})[0]


def shared_model_file(model_file: Path, inputs: tuple[str, ...], output: str, cache_dir: Path) -> Path:
    """The file each worker's session loads: the host's prepacked copy of ``model_file``, whose weights every worker
    maps from one page-cache copy (all-MiniLM-L6-v2: 11 MB of a session's own memory, against 120 MB from the
    original), once it gives the original's output bit for bit; else the original."""
    from phi_api.engine.runtime.prepack import prepacked_copy

    return prepacked_copy(model_file, cache_dir, lambda original, made: _differs(original, made, inputs, output))


def _differs(original: Path, prepacked: Path, inputs: tuple[str, ...], output: str) -> str | None:
    """Why ``prepacked`` cannot stand for ``original`` (its output of a padded batch differs), or None."""
    ids = (np.arange(24, dtype=np.int64).reshape(2, 12) * 7919 + 101) % 1000 + 100
    mask = np.ones_like(ids)
    mask[1, 7:] = 0
    results = [EncoderSession(path, inputs, output, threads=1).run(ids, mask, np.zeros_like(ids))
               for path in (original, prepacked)]
    if np.array_equal(results[0], results[1]):
        return None
    return f"largest difference {float(np.abs(results[0] - results[1]).max()):.3g}"
