"""phi-api's own 4-bit matrix kernel for batched decode: one pass over each tile of weights for all rows of a step.

``q4_kernel.h`` is the kernel (AVX-512 VNNI); ``q4_op.cpp`` puts it in ONNX Runtime as the custom operator
``phi_api.Q4MatMul`` and :mod:`.op` builds that library; :mod:`phi_api.engine.runtime.rewrite` swaps MatMulNBits nodes
for it when a model loads (``INT4_KERNEL``); :mod:`.reference` repacks the weights and computes the same product in
numpy; ``q4_vnni.cpp`` and :mod:`.native` call the kernel through ctypes for the tests and ``phi-api bench kernels``.
"""
