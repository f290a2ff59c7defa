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
        self._session = ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])
        graph_inputs = {value.name for value in self._session.get_inputs()}
        self._inputs = tuple(name for name in inputs if name in graph_inputs)
        self._output = output

    def run(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        """The graph's output for a padded batch (``[rows, length]`` each, int64)."""
        given = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return self._session.run([self._output], {name: given[name] for name in self._inputs})[0]
