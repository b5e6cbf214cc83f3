#!/usr/bin/python3
"""Writes the golden files of tests/trainer/golden_test.cc.

Run with Debian's python3 (which has python3-numpy):
    /usr/bin/python3 tests/trainer/golden/make_golden.py
It rewrites mlp.golden and ctr_dnn.golden next to this script. Everything is
computed in float64 from float32 inputs, independently of the C++ code.

File format (little-endian): b"FGLD0001", u32 tensor count, then per tensor:
u32 name length, name (ASCII), u32 ndim, u32 dims[ndim], f32 data.
"""
import os
import struct

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ADAM = dict(lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0)
ADAM_STEPS = 3


def write_golden(path, tensors):
    with open(path, "wb") as f:
        f.write(b"FGLD0001")
        f.write(struct.pack("<I", len(tensors)))
        for name, value in tensors.items():
            a = np.ascontiguousarray(np.asarray(value, dtype=np.float32))
            if a.ndim == 0:
                a = a.reshape(1)
            f.write(struct.pack("<I", len(name)) + name.encode("ascii"))
            f.write(struct.pack("<I", a.ndim) + struct.pack("<%dI" % a.ndim, *a.shape))
            f.write(a.astype("<f4").tobytes())
    print("wrote %s (%d tensors, %d bytes)" % (path, len(tensors), os.path.getsize(path)))


def f32(a):
    """Round to float32 (what C++ stores) and compute on in float64."""
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def linear_params(rng, sizes):
    """PyTorch nn.Linear default init: U(-1/sqrt(in), 1/sqrt(in))."""
    params = {}
    for l in range(len(sizes) - 1):
        bound = 1.0 / np.sqrt(sizes[l])
        params["fc%d.weight" % (l + 1)] = f32(rng.uniform(-bound, bound, (sizes[l + 1], sizes[l])))
        params["fc%d.bias" % (l + 1)] = f32(rng.uniform(-bound, bound, sizes[l + 1]))
    return params


def adam_run(params, loss_and_grads, out):
    """ADAM_STEPS bias-corrected Adam steps; records loss and params per step."""
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v2 = {k: np.zeros_like(v) for k, v in params.items()}
    p = {k: v.copy() for k, v in params.items()}
    h = ADAM
    out["adam.hparams"] = [h["lr"], h["beta1"], h["beta2"], h["eps"], h["weight_decay"]]
    for t in range(1, ADAM_STEPS + 1):
        loss, grads = loss_and_grads(p)
        out["adam.step%d.loss" % t] = loss
        for k in p:
            g = grads[k] + h["weight_decay"] * p[k]
            m[k] = h["beta1"] * m[k] + (1 - h["beta1"]) * g
            v2[k] = h["beta2"] * v2[k] + (1 - h["beta2"]) * g * g
            mhat = m[k] / (1 - h["beta1"] ** t)
            vhat = v2[k] / (1 - h["beta2"] ** t)
            p[k] = p[k] - h["lr"] * mhat / (np.sqrt(vhat) + h["eps"])
            out["adam.step%d.%s" % (t, k)] = p[k]


# ---- MLP: tanh hidden layers, softmax cross-entropy --------------------------

def mlp_forward_backward(p, x, labels, n_layers):
    B = x.shape[0]
    acts = [x]
    for l in range(1, n_layers + 1):
        z = acts[-1] @ p["fc%d.weight" % l].T + p["fc%d.bias" % l]
        acts.append(np.tanh(z) if l < n_layers else z)
    logits = acts[-1]
    shifted = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    lse = np.log(np.exp(shifted).sum(axis=1)) + logits.max(axis=1)
    loss = np.mean(lse - logits[np.arange(B), labels])
    grads = {}
    dz = probs.copy()
    dz[np.arange(B), labels] -= 1.0
    dz /= B
    for l in range(n_layers, 0, -1):
        grads["fc%d.weight" % l] = dz.T @ acts[l - 1]
        grads["fc%d.bias" % l] = dz.sum(axis=0)
        if l > 1:
            da = dz @ p["fc%d.weight" % l]
            dz = da * (1.0 - acts[l - 1] ** 2)
    return loss, grads, probs


def make_mlp(rng):
    sizes, B = [20, 16, 12, 5], 6
    x = f32(rng.normal(size=(B, sizes[0])))
    labels = rng.integers(0, sizes[-1], size=B)
    params = linear_params(rng, sizes)
    L = len(sizes) - 1
    out = {"config.sizes": sizes, "x": x, "labels": labels}
    out.update(params)
    loss, grads, probs = mlp_forward_backward(params, x, labels, L)
    out["probs"] = probs
    out["loss"] = loss
    for k, g in grads.items():
        out["grad." + k] = g
    adam_run(params, lambda p: mlp_forward_backward(p, x, labels, L)[:2], out)
    return out


# ---- CTR-DNN dense part: pooled slots + dense, FC-ReLU, sigmoid BCE ----------

def ctr_forward_backward(p, pooled, dense, labels, n_layers):
    S, B, D = pooled.shape
    inp = np.concatenate([pooled[s] for s in range(S)] + [dense], axis=1)
    acts = [inp]
    for l in range(1, n_layers + 1):
        z = acts[-1] @ p["fc%d.weight" % l].T + p["fc%d.bias" % l]
        acts.append(np.maximum(z, 0.0) if l < n_layers else z)
    logit = acts[-1][:, 0]
    probs = 1.0 / (1.0 + np.exp(-logit))
    loss = np.mean(np.maximum(logit, 0) - logit * labels + np.log1p(np.exp(-np.abs(logit))))
    grads = {}
    dz = ((probs - labels) / B)[:, None]
    for l in range(n_layers, 0, -1):
        grads["fc%d.weight" % l] = dz.T @ acts[l - 1]
        grads["fc%d.bias" % l] = dz.sum(axis=0)
        da = dz @ p["fc%d.weight" % l]
        dz = da * (acts[l - 1] > 0) if l > 1 else da
    dpooled = np.stack([dz[:, s * D:(s + 1) * D] for s in range(S)])
    return loss, grads, probs, dpooled


def make_ctr(rng):
    S, D, n_dense, hidden, B = 3, 4, 5, [10, 8, 6], 5
    out = {"config": [S, D, n_dense] + hidden}
    pooled = np.zeros((S, B, D))
    bags = []
    for s in range(S):
        counts = rng.integers(0, 4, size=B)
        counts[s % B] = 0  # every slot has an empty bag somewhere
        offsets = np.concatenate([[0], np.cumsum(counts)])
        rows = f32(rng.normal(scale=0.5, size=(offsets[-1], D)))
        mean = s % 2 == 1
        for b in range(B):
            bag = rows[offsets[b]:offsets[b + 1]]
            if len(bag):
                pooled[s, b] = bag.mean(axis=0) if mean else bag.sum(axis=0)
        out["slot%d.rows" % s] = rows
        out["slot%d.offsets" % s] = offsets
        out["slot%d.mean" % s] = [1.0 if mean else 0.0]
        bags.append((offsets, mean))
    pooled = f32(pooled)  # the C++ side pools in float32 too
    dense = f32(rng.normal(size=(B, n_dense)))
    labels = rng.integers(0, 2, size=B).astype(np.float64)
    params = linear_params(rng, [S * D + n_dense] + hidden + [1])
    L = len(hidden) + 1
    out.update({"dense": dense, "labels": labels, "pooled": pooled})
    out.update(params)
    loss, grads, probs, dpooled = ctr_forward_backward(params, pooled, dense, labels, L)
    out["probs"] = probs
    out["loss"] = loss
    for k, g in grads.items():
        out["grad." + k] = g
    out["grad.pooled"] = dpooled
    for s, (offsets, mean) in enumerate(bags):
        drows = np.zeros((offsets[-1], D))
        for b in range(B):
            n = offsets[b + 1] - offsets[b]
            if n:
                drows[offsets[b]:offsets[b + 1]] += dpooled[s, b] / (n if mean else 1)
        out["grad.slot%d.rows" % s] = drows
    adam_run(params, lambda p: ctr_forward_backward(p, pooled, dense, labels, L)[:2], out)
    return out


if __name__ == "__main__":
    write_golden(os.path.join(HERE, "mlp.golden"), make_mlp(np.random.default_rng(5)))
    write_golden(os.path.join(HERE, "ctr_dnn.golden"), make_ctr(np.random.default_rng(6)))
