#!/usr/bin/python3
"""A small GPT-2-shaped Hugging Face checkpoint with random weights, and the
logits of a NumPy forward for fixed tokens: the reference gpt_hf_test
compares FleetPS's GptModel with.

  make_hf_gpt2.py OUT_DIR --dtype F32|F16|BF16 [--prefix] [--lm_head]

writes OUT_DIR/config.json, OUT_DIR/model.safetensors (GPT-2's names and
Conv1D [in, out] layout, plus the causal-mask buffers h.N.attn.bias old
checkpoints carry) and OUT_DIR/expected.json ({"tokens": [...], "logits":
[[...] per position]}). The forward uses the weights as stored (rounded to
the dtype), in float64: GELU tanh (gelu_new), pre-LayerNorm with eps 1e-5,
causal attention, output layer tied to wte. Needs only NumPy.
"""
import argparse
import json
import os
import struct

import numpy as np

L, NH, C, V, P = 2, 2, 32, 67, 16
TOKENS = [5, 17, 3, 66, 0, 42, 9, 9, 31, 12, 1]


def stored(x, dtype):
    """x (float32) as the file stores it: the bytes, and the values back as float64."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "F32":
        return x.tobytes(), x.astype(np.float64)
    if dtype == "F16":
        h = x.astype(np.float16)
        return h.tobytes(), h.astype(np.float64)
    u = x.view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
    back = (u.astype(np.uint32) << 16).view(np.float32)
    return u.tobytes(), back.astype(np.float64)


def layer_norm(x, w, b):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * w + b


def gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def forward(w, tokens):
    T = len(tokens)
    x = w["wte.weight"][tokens] + w["wpe.weight"][:T]
    hs = C // NH
    mask = np.triu(np.ones((T, T), dtype=bool), 1)
    for l in range(L):
        p = f"h.{l}."
        h = layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"])
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = np.split(qkv, 3, axis=-1)
        y = np.zeros((T, C))
        for n in range(NH):
            s = slice(n * hs, (n + 1) * hs)
            att = q[:, s] @ k[:, s].T / np.sqrt(hs)
            att[mask] = -np.inf
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            y[:, s] = att @ v[:, s]
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = layer_norm(x, w[p + "ln_2.weight"], w[p + "ln_2.bias"])
        f = gelu_new(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        x = x + f @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = layer_norm(x, w["ln_f.weight"], w["ln_f.bias"])
    return x @ w["wte.weight"].T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dtype", default="F32", choices=["F32", "F16", "BF16"])
    ap.add_argument("--prefix", action="store_true", help='names start with "transformer."')
    ap.add_argument("--lm_head", action="store_true", help="also store the tied lm_head.weight")
    args = ap.parse_args()
    rng = np.random.default_rng(20261126)

    shapes = {"wte.weight": (V, C), "wpe.weight": (P, C)}
    for l in range(L):
        p = f"h.{l}."
        shapes.update({
            p + "ln_1.weight": (C,), p + "ln_1.bias": (C,),
            p + "attn.c_attn.weight": (C, 3 * C), p + "attn.c_attn.bias": (3 * C,),
            p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,),
            p + "ln_2.weight": (C,), p + "ln_2.bias": (C,),
            p + "mlp.c_fc.weight": (C, 4 * C), p + "mlp.c_fc.bias": (4 * C,),
            p + "mlp.c_proj.weight": (4 * C, C), p + "mlp.c_proj.bias": (C,),
        })
    shapes["ln_f.weight"] = (C,)
    shapes["ln_f.bias"] = (C,)

    weights, blobs = {}, []
    for name, shape in shapes.items():
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            x = 1.0 + 0.1 * rng.standard_normal(shape)
        else:
            x = (0.3 if name.startswith("w") else 0.15) * rng.standard_normal(shape)
        data, values = stored(x, args.dtype)
        weights[name] = values
        blobs.append((name, args.dtype, list(shape), data))
    # Buffers and the tied head, which a reader must skip or check.
    for l in range(L):
        mask = np.tril(np.ones((1, 1, P, P), dtype=np.uint8))
        blobs.append((f"h.{l}.attn.bias", "U8", [1, 1, P, P], mask.tobytes()))
    if args.lm_head:
        blobs.append(("lm_head.weight", args.dtype, [V, C], stored(weights["wte.weight"], args.dtype)[0]))

    os.makedirs(args.out, exist_ok=True)
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    prefix = "transformer." if args.prefix else ""
    for name, dtype, shape, data in blobs:
        key = name if name == "lm_head.weight" else prefix + name
        header[key] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(args.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, _, data in blobs:
            f.write(data)
    config = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
              "activation_function": "gelu_new", "n_layer": L, "n_head": NH, "n_embd": C,
              "n_positions": P, "n_ctx": P, "vocab_size": V, "n_inner": None,
              "layer_norm_epsilon": 1e-5, "torch_dtype": "float32"}
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    logits = forward(weights, TOKENS)
    with open(os.path.join(args.out, "expected.json"), "w") as f:
        json.dump({"tokens": TOKENS, "logits": logits.tolist()}, f)


if __name__ == "__main__":
    main()
