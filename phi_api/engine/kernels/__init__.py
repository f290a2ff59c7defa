"""phi-api's own kernels, as ONNX Runtime custom operators in one library (AVX-512 VNNI).

- The 4-bit and 8-bit matrix kernel for batched decode and prompts, one pass over each tile of weights for all rows
  of a step: ``q4_kernel.h``, the operators ``phi_api.Q4MatMul`` and ``phi_api.Q8MatMul``;
  :mod:`phi_api.engine.runtime.rewrite` swaps MatMulNBits nodes for them when a model loads (``INT4_KERNEL``);
  :mod:`.reference` repacks the weights and computes the same product in numpy; ``q4_vnni.cpp`` and
  :mod:`.native` call the kernel through ctypes for the tests and ``phi-api bench kernels``.
- bfloat16 weights for a quantized model's float32 matrices, multiplied in float32: ``bf16_kernel.h``, the operator
  ``phi_api.BF16MatMul``, swapped in by the same rewrite; :func:`.reference.pack_bf16` lays its weights out.
- The attention over int8 or int4 keys and values, or float32 ones: ``attention_kernel.h`` (the int4 codec in
  ``attention_int4.h``), the operators ``phi_api.Attention``, ``phi_api.Attention4`` and ``phi_api.AttentionFloat``
  (``attention_op.h``); :mod:`phi_api.engine.runtime.attention`
  swaps GroupQueryAttention nodes for them (``ATTENTION_KERNEL``); :mod:`.attention_reference` computes the same
  in numpy and :mod:`.attention_graph` makes one-node graphs for the tests and ``phi-api bench attention``.

``ops.cpp`` registers the operators; :mod:`.op` builds the library and finds it (in the cache, or in ``prebuilt/``,
where the Docker image ships it).
"""
