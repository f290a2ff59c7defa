"""The step's logits only where they are read: a prompt chunk's last position, not each of its tokens.

The model builder's graph multiplies every new position's hidden state by the vocabulary matrix. A prompt chunk reads
only its last position's logits (the next token's), unless the request asks for the prompt's own log-probabilities
or a draft is checked. On the default model (a 49,152-token vocabulary over 576 channels) the vocabulary matrix is a
fifth of a prompt's multiplies (measured: 31 of 175 ms for a 170-token chunk); vLLM likewise computes logits only at
the positions it samples.

So the graph phi-api writes (:mod:`engine.runtime.attention`) slices the hidden states before the vocabulary matrix
along the positions, from an input :data:`LOGITS_FROM` the session binds each step (:class:`engine.runtime.session.
Decoder`): ``-1`` keeps the last position, ``0`` every one. Each position's logits are computed from that position
alone, so the slice changes no bit of a row-wise graph's logits (:mod:`engine.runtime.rowwise`).
"""

from __future__ import annotations

from typing import Any

from phi_api.engine.runtime.graphs import slice_node

LOGITS_FROM = "phi_api_logits_from"  # int64 [1]: the first new position whose logits the step computes
_PRODUCTS = frozenset({("com.microsoft", "MatMulNBits"), ("", "MatMul"), ("phi_api", "Q4MatMul"),
                       ("phi_api", "Q8MatMul"), ("phi_api", "BF16MatMul")})
# Between the product and the logits (the kernel's padding cut, Gemma's softcap): computed position by position; a
# Slice there cuts columns (the padding), never positions.
_POSITION_WISE = frozenset({"Slice", "Cast", "Tanh", "Mul", "Div", "Add"})


def vocabulary_product(graph: Any, logits: str) -> Any | None:
    """The node multiplying hidden states by the vocabulary matrix whose result becomes ``logits`` (through
    position-wise nodes only), or None where the graph is of another form."""
    producers = {output: node for node in graph.node for output in node.output}
    node = producers.get(logits)
    while node is not None and (node.domain or "", node.op_type) not in _PRODUCTS:
        if node.op_type not in _POSITION_WISE or node.domain:
            return None
        node = producers.get(node.input[0])
    return node


def slice_positions(model: Any, logits: str = "logits") -> bool:
    """Add :data:`LOGITS_FROM` to ``model`` (an onnx ModelProto, changed in place) and slice the vocabulary
    product's input from it: whether the graph could take it (otherwise nothing is changed)."""
    from onnx import TensorProto, helper

    graph = model.graph
    product = vocabulary_product(graph, logits)
    if product is None or any(value.name == LOGITS_FROM for value in graph.input):
        return False
    hidden = product.input[0]
    sliced = f"{hidden}.{LOGITS_FROM}"
    cut, bounds = slice_node(hidden, sliced, f"{LOGITS_FROM}.slice", starts=LOGITS_FROM, ends=2 ** 63 - 1, axis=1)
    graph.initializer.extend(bounds)
    graph.input.append(helper.make_tensor_value_info(LOGITS_FROM, TensorProto.INT64, [1]))
    product.input[0] = sliced
    for value in graph.output:  # its positions are no longer the input's
        if value.name == logits and len(value.type.tensor_type.shape.dim) == 3:
            value.type.tensor_type.shape.dim[1].dim_param = "logits_positions"
    nodes = list(graph.node)
    nodes.insert(next(index for index, node in enumerate(nodes) if node.output[0] == product.output[0]), cut)
    del graph.node[:]
    graph.node.extend(nodes)
    return True
