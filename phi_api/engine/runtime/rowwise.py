"""Whether a decoder graph computes every row of a step on its own: a row's bits the same whatever the step's
other rows, and however many there are, odd counts included.

``BATCH_INVARIANT`` pads a step of an odd number of rows with one more (:mod:`engine.sched.padding`) because ONNX
Runtime's matrix kernels add a lone row's sums in another order than a pair's. phi-api's 4-bit, 8-bit and BF16
operators and its attention operator compute each row the same way at any row count, and the other operators of the
decoder graphs work element by element or within a row; a graph made only of such operators needs no padding row, and
one stream stops paying for a second (the default model's too, its float32 matrices on the BF16 operator).
The list is of operators checked, not assumed (``tests/engine/runtime/test_invariance.py``
steps a real graph made of them with one to five rows).

Such a graph also computes several new tokens of one row (a draft's check) as one-token steps compute them, bit for
bit (the matrix operators' rows are tokens as well; the attention walks keys on grids fixed by their positions), so
drafts change no answer there (``tests/integration/test_draft_identity.py``): batch-invariant, any draft source
drafts and checks are made where they pay (:mod:`engine.sched.continuous`).
"""

from __future__ import annotations

from pathlib import Path

# (domain, operator): each computes a row from that row alone, in the same order at any row count.
# The If of a LongRoPE graph picks the rotary caches for the whole step by its longest row, as before.
ROW_WISE = frozenset({
    ("phi_api", "Q4MatMul"), ("phi_api", "Q8MatMul"), ("phi_api", "BF16MatMul"), ("phi_api", "Attention"),
    ("phi_api", "Attention4"),
    ("phi_api", "AttentionFloat"),
    ("com.microsoft", "SkipSimplifiedLayerNormalization"), ("", "SimplifiedLayerNormalization"),
    ("com.microsoft", "QuickGelu"), ("", "Mul"), ("", "Sub"), ("", "Gather"), ("", "Cast"), ("", "Shape"),
    ("", "ReduceSum"), ("", "Greater"), ("", "If"), ("", "Slice"),
})


def row_wise(graph_file: Path) -> bool:
    """Whether every node of the graph (its weights are not read) is one of :data:`ROW_WISE`."""
    import onnx

    graph = onnx.load(str(graph_file), load_external_data=False).graph
    return all((node.domain or "", node.op_type) in ROW_WISE for node in graph.node)
