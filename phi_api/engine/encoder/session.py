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

    def run(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        """The graph's output for a padded batch (``[rows, length]`` each, int64)."""
        given = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return self._session.run([self._output], {name: given[name] for name in self._inputs})[0]
