"""Small pieces of ONNX graph editing that the rewrites share (the matrix kernel's, the attention's, the logits'
slice): a node's attributes, and a Slice along one axis with its constant bounds."""

from __future__ import annotations

from typing import Any


def node_attributes(node: Any) -> dict[str, Any]:
    """``node``'s attributes by name, as Python values."""
    from onnx import helper

    return {attribute.name: helper.get_attribute_value(attribute) for attribute in node.attribute}


def slice_node(data: str, output: str, name: str, starts: int | str, ends: int, axis: int) -> tuple[Any, list[Any]]:
    """A Slice node ``name`` of ``data`` along ``axis`` into ``output``, and the initializers of its constant bounds
    (named after the node). ``starts`` is a constant, or the name of a tensor the graph computes or takes as input."""
    import numpy as np
    from onnx import helper, numpy_helper

    constants = {"ends": ends, "axes": axis} if isinstance(starts, str) else {"starts": starts, "ends": ends,
                                                                             "axes": axis}
    tensors = {key: numpy_helper.from_array(np.array([value], dtype=np.int64), f"{name}.{key}")
               for key, value in constants.items()}
    inputs = [tensors[key].name if key in tensors else str(starts) for key in ("starts", "ends", "axes")]
    return helper.make_node("Slice", [data, *inputs], [output], name=name), list(tensors.values())
