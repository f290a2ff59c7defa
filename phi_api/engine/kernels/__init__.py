"""phi-api's own 4-bit matrix kernel for batched decode (issue 44's spike, not yet in the serving path).

``q4_vnni.cpp`` multiplies up to 16 rows by MatMulNBits' 4-bit weights in one pass over each tile of weights
(AVX-512 VNNI); :mod:`.reference` repacks MatMulNBits' weights for it and computes the same product in numpy;
:mod:`.native` builds the library with g++ and calls it. ``phi-api bench kernels --ours`` measures it against
ONNX Runtime's kernel (docs/kernels.md).
"""
