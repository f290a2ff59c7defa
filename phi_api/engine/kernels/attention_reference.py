"""What phi-api's attention operator computes, in numpy: ONNX Runtime's ``GroupQueryAttention`` on a packed
query-key-value input, with keys and values kept in a cache bound as both past and present (in float32, or in int8
with one scale per head and channel), extended to several new tokens for each of several rows of different
lengths (GroupQueryAttention takes several new tokens on top of a past only for a batch of one).

Row ``b`` holds ``lengths[b]`` tokens once the step's ``S`` new ones are in: they sit at positions
``lengths[b] - S .. lengths[b] - 1``. Each new query and key is rotated (rotary embedding, the halves of the first
``2 * cos.shape[1]`` channels, or pairs when ``interleaved``) at its position; the new keys and values are written
into the cache there (quantized: ``clip(rint(x * (1 / scale)), -128, 127)``, as ONNX Runtime rounds); then query
``s`` of head ``h`` attends, with kv head ``h // (heads // kv_heads)``, to the keys at positions up to its own (the
last ``window`` of them when ``window`` > 0), its scores scaled by ``scale`` and capped (``softcap``).
"""

from __future__ import annotations

import numpy as np


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool = False) -> np.ndarray:
    """``x [..., head_size]`` rotated with ``cos``/``sin [..., rot / 2]`` (one row per position)."""
    out = x.astype(np.float32).copy()
    half = cos.shape[-1]
    if interleaved:
        even, odd = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
        out[..., 0:2 * half:2] = even * cos - odd * sin
        out[..., 1:2 * half:2] = odd * cos + even * sin
    else:
        first, second = x[..., :half], x[..., half:2 * half]
        out[..., :half] = first * cos - second * sin
        out[..., half:2 * half] = second * cos + first * sin
    return out


def quantize(x: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``x`` in int8 with one scale per channel (ONNX Runtime's rounding: half to even, of ``x * (1 / scale)``)."""
    inverse = (np.float32(1.0) / scale.astype(np.float32)).astype(np.float32)
    return np.clip(np.rint(x.astype(np.float32) * inverse), -128, 127).astype(np.int8)


def attention(qkv: np.ndarray, keys: np.ndarray, values: np.ndarray, lengths: np.ndarray, cos: np.ndarray,
              sin: np.ndarray, *, heads: int, kv_heads: int, scale: float, window: int = -1, softcap: float = 0.0,
              rotary: bool = True, interleaved: bool = False, key_scale: np.ndarray | None = None,
              value_scale: np.ndarray | None = None) -> np.ndarray:
    """One step: ``qkv [B, S, (heads + 2 kv_heads) * D]`` float32; ``keys``/``values [B, kv_heads, L, D]``, the
    cache (float32, or int8 with ``key_scale``/``value_scale [kv_heads, D]``), written in place; ``lengths [B]``.
    Returns the output ``[B, S, heads * D]``."""
    rows, new, width = qkv.shape
    size = width // (heads + 2 * kv_heads)
    group = heads // kv_heads
    split = qkv.reshape(rows, new, heads + 2 * kv_heads, size).astype(np.float32)
    out = np.zeros((rows, new, heads, size), dtype=np.float32)
    for b in range(rows):
        length = int(lengths[b])
        positions = np.arange(length - new, length)
        query, key, value = split[b, :, :heads], split[b, :, heads:heads + kv_heads], split[b, :, heads + kv_heads:]
        if rotary:
            c, s = cos[positions][:, None, :], sin[positions][:, None, :]
            query, key = rotate(query, c, s, interleaved), rotate(key, c, s, interleaved)
        for h in range(kv_heads):
            if key_scale is None or value_scale is None:
                keys[b, h, positions] = key[:, h]
                values[b, h, positions] = value[:, h]
            else:
                keys[b, h, positions] = quantize(key[:, h], key_scale[h])
                values[b, h, positions] = quantize(value[:, h], value_scale[h])
        for h in range(heads):
            kv = h // group
            past_k = keys[b, kv, :length].astype(np.float64) * (1.0 if key_scale is None else key_scale[kv])
            past_v = values[b, kv, :length].astype(np.float64) * (1.0 if value_scale is None else value_scale[kv])
            for token in range(new):
                end = int(positions[token]) + 1
                start = max(0, end - window) if window > 0 else 0
                scores = past_k[start:end] @ query[token, h].astype(np.float64) * scale
                if softcap > 0:
                    scores = softcap * np.tanh(scores / softcap)
                weights = np.exp(scores - scores.max())
                out[b, token, h] = (weights / weights.sum()) @ past_v[start:end]
    return out.reshape(rows, new, heads * size)


KEY_TILE = 16  # tokens of a key tile in the operator's layout (attention_kernel.h)


def tiled(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A cache ``[..., L, D]`` (L a multiple of 16) in the operator's layout: int8 keys in tiles of 16 tokens
    ``[D / 2][16][2]``, values in pairs of tokens ``[D][2]``; float32 keys in tiles of 16 tokens ``[D][16]``, values
    as they are."""
    *lead, length, size = keys.shape
    if keys.dtype == np.float32:
        k = keys.reshape(*lead, length // KEY_TILE, KEY_TILE, size).swapaxes(-2, -1)
        return np.ascontiguousarray(k).reshape(*lead, length, size), values.copy()
    k = keys.reshape(*lead, length // KEY_TILE, KEY_TILE, size // 2, 2).swapaxes(-3, -2)
    v = values.reshape(*lead, length // 2, 2, size).swapaxes(-2, -1)
    return (np.ascontiguousarray(k).reshape(*lead, length, size), np.ascontiguousarray(v).reshape(*lead, length, size))


def untiled(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The operator's layout back to ``[..., L, D]``."""
    *lead, length, size = keys.shape
    if keys.dtype == np.float32:
        k = keys.reshape(*lead, length // KEY_TILE, size, KEY_TILE).swapaxes(-2, -1)
        return np.ascontiguousarray(k).reshape(*lead, length, size), values.copy()
    k = keys.reshape(*lead, length // KEY_TILE, size // 2, KEY_TILE, 2).swapaxes(-3, -2)
    v = values.reshape(*lead, length // 2, size, 2).swapaxes(-2, -1)
    return (np.ascontiguousarray(k).reshape(*lead, length, size), np.ascontiguousarray(v).reshape(*lead, length, size))
