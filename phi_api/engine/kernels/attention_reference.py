"""What phi-api's attention operator computes, in numpy: ONNX Runtime's ``GroupQueryAttention`` on a packed
query-key-value input, with keys and values kept in a cache bound as both past and present (in float32, in int8
with one scale per head and channel, or in int4 with a scale per token besides), extended to several new tokens for
each of several rows of different lengths (GroupQueryAttention takes several new tokens on top of a past only for a
batch of one).

Row ``b`` holds ``lengths[b]`` tokens once the step's ``S`` new ones are in: they sit at positions
``lengths[b] - S .. lengths[b] - 1``. Each new query and key is rotated (rotary embedding, the halves of the first
``2 * cos.shape[1]`` channels, or pairs when ``interleaved``) at its position; the new keys and values are written
into the cache there (int8: ``clip(rint(x * (1 / scale)), -128, 127)``, as ONNX Runtime rounds; int4: see
:func:`quantize4`); then query
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


def quantize4(x: np.ndarray, scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``x [..., D]`` in 4 bits: divided by its channels' ``scale`` (as for int8), then each vector rounded with a
    scale of its own, its largest magnitude over 7. Returns the values in ``[-7, 7]`` (int8) and the scales
    ``[...]``, in the operator's float32 arithmetic."""
    inverse = (np.float32(1.0) / scale.astype(np.float32)).astype(np.float32)
    normal = (x.astype(np.float32) * inverse).astype(np.float32)
    largest = np.abs(normal).max(axis=-1)
    with np.errstate(divide="ignore"):
        to_units = np.where(largest > 0, np.float32(7.0) / largest, np.float32(0.0)).astype(np.float32)
    units = np.clip(np.rint(normal * to_units[..., None]), -7, 7).astype(np.int8)
    return units, (largest / np.float32(7.0)).astype(np.float32)


def attention(qkv: np.ndarray, keys: np.ndarray, values: np.ndarray, lengths: np.ndarray, cos: np.ndarray,
              sin: np.ndarray, *, heads: int, kv_heads: int, scale: float, window: int = -1, softcap: float = 0.0,
              rotary: bool = True, interleaved: bool = False, key_scale: np.ndarray | None = None,
              value_scale: np.ndarray | None = None,
              token_scales: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """One step: ``qkv [B, S, (heads + 2 kv_heads) * D]`` float32; ``keys``/``values [B, kv_heads, L, D]``, the
    cache (float32; int8 with ``key_scale``/``value_scale [kv_heads, D]``; int4, values in [-7, 7], with those and
    the keys' and values' ``token_scales [B, kv_heads, L]`` besides), written in place; ``lengths [B]``. With int4,
    a query takes its own token's key and value exact (float32), the others from the cache.
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
            elif token_scales is not None:
                keys[b, h, positions], token_scales[0][b, h, positions] = quantize4(key[:, h], key_scale[h])
                values[b, h, positions], token_scales[1][b, h, positions] = quantize4(value[:, h], value_scale[h])
            else:
                keys[b, h, positions] = quantize(key[:, h], key_scale[h])
                values[b, h, positions] = quantize(value[:, h], value_scale[h])
        for h in range(heads):
            kv = h // group
            past_k = keys[b, kv, :length].astype(np.float64) * (1.0 if key_scale is None else key_scale[kv])
            past_v = values[b, kv, :length].astype(np.float64) * (1.0 if value_scale is None else value_scale[kv])
            if token_scales is not None:
                past_k *= token_scales[0][b, kv, :length, None]
                past_v *= token_scales[1][b, kv, :length, None]
            for token in range(new):
                end = int(positions[token]) + 1
                start = max(0, end - window) if window > 0 else 0
                seen_k, seen_v = past_k[start:end].copy(), past_v[start:end].copy()
                if token_scales is not None:  # its own token exact
                    seen_k[-1], seen_v[-1] = key[token, kv], value[token, kv]
                scores = seen_k @ query[token, h].astype(np.float64) * scale
                if softcap > 0:
                    scores = softcap * np.tanh(scores / softcap)
                weights = np.exp(scores - scores.max())
                out[b, token, h] = (weights / weights.sum()) @ seen_v
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


def packed4(keys: np.ndarray, values: np.ndarray, key_tokens: np.ndarray, value_tokens: np.ndarray) -> tuple[
        np.ndarray, np.ndarray]:
    """An int4 cache (``[..., L, D]`` values in [-7, 7], their token scales ``[..., L]``) in the operator's layout
    ``[..., L, D / 2 + 4]`` (int8 bytes; see attention_int4.h): per tile of 16 tokens, the int8 layout's groups of 32
    values, two groups to 32 bytes of nibbles (each value plus 8; the first group's value i in byte i's low nibble, the
    second's in its high one), then the 16 tokens' scales."""
    *lead, length, size = keys.shape
    tiles = length // KEY_TILE
    k = keys.reshape(*lead, tiles, KEY_TILE, size // 2, 2).swapaxes(-3, -2)
    v = np.moveaxis(values.reshape(*lead, tiles, KEY_TILE // 2, 2, size // 16, 16), -3, -1)  # [j][l][16][2]
    out = []
    for units, scales in ((k, key_tokens), (v, value_tokens)):
        groups = (units.reshape(*lead, tiles, size // 4, 2, 32) + 8).astype(np.uint8)
        nibbles = (groups[..., 0, :] | (groups[..., 1, :] << 4)).reshape(*lead, tiles, 8 * size)
        tail = np.ascontiguousarray(scales.astype(np.float32)).view(np.uint8).reshape(*lead, tiles, 64)
        out.append(np.concatenate([nibbles, tail], axis=-1).reshape(*lead, length, size // 2 + 4).view(np.int8))
    return out[0], out[1]


def unpacked4(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The operator's int4 layout back to :func:`packed4`'s inputs: keys, values, and their token scales."""
    *lead, length, width = keys.shape
    size, tiles = (width - 4) * 2, length // KEY_TILE
    out = []
    for data in (keys, values):
        tile = data.view(np.uint8).reshape(*lead, tiles, 8 * size + 64)
        nibbles = tile[..., :8 * size].reshape(*lead, tiles, size // 4, 1, 32)
        groups = np.concatenate([nibbles & 15, nibbles >> 4], axis=-2).astype(np.int8) - 8
        scales = np.ascontiguousarray(tile[..., 8 * size:]).view(np.float32).reshape(*lead, length)
        out.append((groups, scales))
    (k, key_tokens), (v, value_tokens) = out
    k = k.reshape(*lead, tiles, size // 2, KEY_TILE, 2).swapaxes(-3, -2).reshape(*lead, length, size)
    v = np.moveaxis(v.reshape(*lead, tiles, KEY_TILE // 2, size // 16, 16, 2), -1, -3).reshape(*lead, length, size)
    return k, v, key_tokens, value_tokens
