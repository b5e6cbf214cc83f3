#!/usr/bin/python3
"""Writes the golden files of tests/trainer/gpt_kernels_test.cc,
gpt_model_test.cc and adamw_test.cc.

Run with Debian's python3 (which has python3-numpy):
    /usr/bin/python3 tests/trainer/golden/make_gpt_golden.py
It rewrites gpt_kernels.golden, gpt_model.golden and adamw.golden next to
this script. Everything is computed in float64 from float32 inputs,
independently of the C++ code; the script checks its own model gradients by
finite differences before writing anything. File format: make_golden.py's.
"""
import math
import os

import numpy as np

from make_golden import HERE, f32, write_golden

GELU_S = math.sqrt(2.0 / math.pi)
GELU_C = 0.044715
LN_EPS = 1e-5


# ---- layers (float64; the C++ kernels' semantics) ------------------------------------

def encoder_fwd(tokens, wte, wpe):
    T = tokens.shape[1]
    return wte[tokens] + wpe[:T][None]


def encoder_bwd(dout, tokens, V, P):
    C = dout.shape[-1]
    dwte = np.zeros((V, C))
    np.add.at(dwte, tokens.reshape(-1), dout.reshape(-1, C))
    dwpe = np.zeros((P, C))
    dwpe[:tokens.shape[1]] = dout.sum(axis=0)
    return dwte, dwpe


def ln_fwd(x, w, b):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt(var + LN_EPS)
    return (x - mean) * rstd * w + b, mean[..., 0], rstd[..., 0]


def ln_bwd(dout, x, w, mean, rstd):
    C = x.shape[-1]
    xhat = (x - mean[..., None]) * rstd[..., None]
    dxhat = dout * w
    dx = rstd[..., None] * (dxhat - dxhat.mean(axis=-1, keepdims=True)
                            - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, (dout * xhat).reshape(-1, C).sum(axis=0), dout.reshape(-1, C).sum(axis=0)


def matmul_fwd(x, w, b):
    y = x @ w.T
    return y + b if b is not None else y


def matmul_bwd(dout, x, w):
    OC, IC = w.shape
    return dout @ w, dout.reshape(-1, OC).T @ x.reshape(-1, IC), dout.reshape(-1, OC).sum(axis=0)


def split_heads(a, NH):
    B, T, C = a.shape
    return a.reshape(B, T, NH, C // NH).transpose(0, 2, 1, 3)


def merge_heads(a):
    B, NH, T, hs = a.shape
    return a.transpose(0, 2, 1, 3).reshape(B, T, NH * hs)


def attn_fwd(qkv, NH):
    C = qkv.shape[-1] // 3
    q, k, v = (split_heads(qkv[..., i * C:(i + 1) * C], NH) for i in range(3))
    T = qkv.shape[1]
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(C // NH)
    s = np.where(np.tril(np.ones((T, T), dtype=bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return merge_heads(p @ v), p


def attn_bwd(dy, qkv, p, NH):
    C = qkv.shape[-1] // 3
    q, k, v = (split_heads(qkv[..., i * C:(i + 1) * C], NH) for i in range(3))
    dyh = split_heads(dy, NH)
    dv = p.transpose(0, 1, 3, 2) @ dyh
    dp = dyh @ v.transpose(0, 1, 3, 2)
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True)) / math.sqrt(C // NH)
    dq = ds @ k
    dk = ds.transpose(0, 1, 3, 2) @ q
    return np.concatenate([merge_heads(dq), merge_heads(dk), merge_heads(dv)], axis=-1)


def gelu_fwd(x):
    return 0.5 * x * (1.0 + np.tanh(GELU_S * (x + GELU_C * x ** 3)))


def gelu_bwd(x, dout):
    th = np.tanh(GELU_S * (x + GELU_C * x ** 3))
    grad = 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * GELU_S * (1.0 + 3.0 * GELU_C * x * x)
    return grad * dout


def cross_entropy(logits, targets, dloss):
    """Per-row losses and dloss * (softmax - onehot); rows with target < 0 give 0."""
    z = logits - logits.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=-1))
    valid = targets >= 0
    t = np.where(valid, targets, 0)
    losses = np.where(valid, lse - z[np.arange(len(t)), t], 0.0)
    probs = np.exp(z - lse[:, None])
    probs[np.arange(len(t)), t] -= 1.0
    return losses, np.where(valid[:, None], dloss * probs, 0.0)


# ---- the model ------------------------------------------------------------------------

BLOCK_TENSORS = ["ln_1.weight", "ln_1.bias", "attn.qkv.weight", "attn.qkv.bias",
                 "attn.proj.weight", "attn.proj.bias", "ln_2.weight", "ln_2.bias",
                 "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias"]


def param_table(cfg):
    """[(name, shape)] in the C++ arena's order (GptParamTable)."""
    V, P, C, F, L = cfg["V"], cfg["P"], cfg["C"], cfg["F"], cfg["L"]
    shapes = {"ln_1.weight": (C,), "ln_1.bias": (C,), "attn.qkv.weight": (3 * C, C),
              "attn.qkv.bias": (3 * C,), "attn.proj.weight": (C, C), "attn.proj.bias": (C,),
              "ln_2.weight": (C,), "ln_2.bias": (C,), "mlp.fc.weight": (F, C),
              "mlp.fc.bias": (F,), "mlp.proj.weight": (C, F), "mlp.proj.bias": (C,)}
    table = [("wte", (V, C)), ("wpe", (P, C))]
    for l in range(L):
        table += [("h.%d.%s" % (l, n), shapes[n]) for n in BLOCK_TENSORS]
    return table + [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]


def random_params(rng, cfg):
    """Random (not GPT-2-initialised) values so that every path carries signal."""
    params = {}
    for name, shape in param_table(cfg):
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            params[name] = f32(1.0 + 0.1 * rng.normal(size=shape))
        elif len(shape) == 1:
            params[name] = f32(0.05 * rng.normal(size=shape))
        else:
            params[name] = f32(0.2 * rng.normal(size=shape))
    return params


def gpt_loss_and_grads(p, tokens, targets, cfg):
    B, T = tokens.shape
    V, P, C, L, NH = cfg["V"], cfg["P"], cfg["C"], cfg["L"], cfg["NH"]
    h = lambda l, n: p["h.%d.%s" % (l, n)]
    x = encoder_fwd(tokens, p["wte"], p["wpe"])
    caches = []
    for l in range(L):
        ln1, m1, r1 = ln_fwd(x, h(l, "ln_1.weight"), h(l, "ln_1.bias"))
        qkv = matmul_fwd(ln1, h(l, "attn.qkv.weight"), h(l, "attn.qkv.bias"))
        atty, att = attn_fwd(qkv, NH)
        res2 = x + matmul_fwd(atty, h(l, "attn.proj.weight"), h(l, "attn.proj.bias"))
        ln2, m2, r2 = ln_fwd(res2, h(l, "ln_2.weight"), h(l, "ln_2.bias"))
        fch = matmul_fwd(ln2, h(l, "mlp.fc.weight"), h(l, "mlp.fc.bias"))
        fchg = gelu_fwd(fch)
        caches.append((x, ln1, m1, r1, qkv, atty, att, res2, ln2, m2, r2, fch, fchg))
        x = res2 + matmul_fwd(fchg, h(l, "mlp.proj.weight"), h(l, "mlp.proj.bias"))
    lnf, mf, rf = ln_fwd(x, p["ln_f.weight"], p["ln_f.bias"])
    logits = lnf @ p["wte"].T
    flat_t = targets.reshape(-1)
    count = (flat_t >= 0).sum()
    losses, dlogits = cross_entropy(logits.reshape(-1, V), flat_t, 1.0 / count)
    loss = losses.sum() / count

    g = {}
    dlogits = dlogits.reshape(B, T, V)
    dlnf = dlogits @ p["wte"]
    g["wte"] = dlogits.reshape(-1, V).T @ lnf.reshape(-1, C)
    dx, g["ln_f.weight"], g["ln_f.bias"] = ln_bwd(dlnf, x, p["ln_f.weight"], mf, rf)
    for l in reversed(range(L)):
        (xin, ln1, m1, r1, qkv, atty, att, res2, ln2, m2, r2, fch, fchg) = caches[l]
        n = lambda s: "h.%d.%s" % (l, s)
        dfchg, g[n("mlp.proj.weight")], g[n("mlp.proj.bias")] = matmul_bwd(dx, fchg, h(l, "mlp.proj.weight"))
        dfch = gelu_bwd(fch, dfchg)
        dln2, g[n("mlp.fc.weight")], g[n("mlp.fc.bias")] = matmul_bwd(dfch, ln2, h(l, "mlp.fc.weight"))
        dres2, g[n("ln_2.weight")], g[n("ln_2.bias")] = ln_bwd(dln2, res2, h(l, "ln_2.weight"), m2, r2)
        dres2 = dres2 + dx
        datty, g[n("attn.proj.weight")], g[n("attn.proj.bias")] = matmul_bwd(dres2, atty, h(l, "attn.proj.weight"))
        dqkv = attn_bwd(datty, qkv, att, NH)
        dln1, g[n("attn.qkv.weight")], g[n("attn.qkv.bias")] = matmul_bwd(dqkv, ln1, h(l, "attn.qkv.weight"))
        dxin, g[n("ln_1.weight")], g[n("ln_1.bias")] = ln_bwd(dln1, xin, h(l, "ln_1.weight"), m1, r1)
        dx = dres2 + dxin
    dwte, g["wpe"] = encoder_bwd(dx, tokens, V, P)
    g["wte"] = g["wte"] + dwte
    return loss, g


def check_model_grads(p, tokens, targets, cfg, rng):
    """Central differences on a few elements of every tensor: the script's own
    backward must be right before its numbers become golden."""
    _, g = gpt_loss_and_grads(p, tokens, targets, cfg)
    h = 1e-6
    for name, shape in param_table(cfg):
        for _ in range(3):
            idx = tuple(rng.integers(0, s) for s in shape)
            saved = p[name][idx]
            p[name][idx] = saved + h
            up, _ = gpt_loss_and_grads(p, tokens, targets, cfg)
            p[name][idx] = saved - h
            down, _ = gpt_loss_and_grads(p, tokens, targets, cfg)
            p[name][idx] = saved
            num = (up - down) / (2 * h)
            assert abs(num - g[name][idx]) <= 1e-6 + 1e-5 * abs(num), (name, idx, num, g[name][idx])


# ---- AdamW ------------------------------------------------------------------------------

def adamw_hparams(eps=1e-8):
    return dict(beta1=0.9, beta2=0.95, eps=eps, weight_decay=0.1, clip_norm=0.5,
                max_lr=3e-3, min_lr=3e-4, warmup_steps=2, decay_steps=5)


def lr_at(h, step):
    if step < h["warmup_steps"]:
        return h["max_lr"] * (step + 1) / h["warmup_steps"]
    if step >= h["decay_steps"]:
        return h["min_lr"]
    r = (step - h["warmup_steps"]) / (h["decay_steps"] - h["warmup_steps"])
    return h["min_lr"] + 0.5 * (1 + math.cos(math.pi * r)) * (h["max_lr"] - h["min_lr"])


def adamw_step(h, p, g, m, v, t, decay):
    """One step over dicts of tensors; clipping by the global norm first."""
    norm = math.sqrt(sum((gi ** 2).sum() for gi in g.values()))
    scale = h["clip_norm"] / max(norm, h["clip_norm"]) if h["clip_norm"] > 0 else 1.0
    lr = lr_at(h, t - 1)
    for k in p:
        gk = g[k] * scale
        m[k] = h["beta1"] * m[k] + (1 - h["beta1"]) * gk
        v[k] = h["beta2"] * v[k] + (1 - h["beta2"]) * gk * gk
        mhat = m[k] / (1 - h["beta1"] ** t)
        vhat = v[k] / (1 - h["beta2"] ** t)
        wd = h["weight_decay"] if decay(k) else 0.0
        p[k] = p[k] - lr * (mhat / (np.sqrt(vhat) + h["eps"]) + wd * p[k])
    return norm


def hparams_vector(h):
    return [h[k] for k in ("beta1", "beta2", "eps", "weight_decay", "clip_norm", "max_lr",
                           "min_lr", "warmup_steps", "decay_steps")]


# ---- files ------------------------------------------------------------------------------

def make_kernels(rng):
    out = {}
    # Encoder, LayerNorm, matmul, GELU on small shapes; B=2, T=5, C=8.
    B, T, C, V, P, F = 2, 5, 8, 11, 7, 12
    out["shape"] = [B, T, C, V, P, F]
    tokens = rng.integers(0, V, size=(B, T))
    tokens[1, 2] = tokens[0, 0]  # a repeated token: its gradient rows add
    wte, wpe = f32(rng.normal(size=(V, C))), f32(rng.normal(size=(P, C)))
    dout = f32(rng.normal(size=(B, T, C)))
    out.update({"enc.tokens": tokens, "enc.wte": wte, "enc.wpe": wpe, "enc.dout": dout,
                "enc.out": encoder_fwd(tokens, wte, wpe)})
    out["enc.dwte"], out["enc.dwpe"] = encoder_bwd(dout, tokens, V, P)

    x, w, b = f32(rng.normal(size=(B, T, C)) * 2 + 1), f32(rng.normal(size=C)), f32(rng.normal(size=C))
    y, mean, rstd = ln_fwd(x, w, b)
    out.update({"ln.inp": x, "ln.weight": w, "ln.bias": b, "ln.dout": dout, "ln.out": y,
                "ln.mean": mean, "ln.rstd": rstd})
    out["ln.dinp"], out["ln.dweight"], out["ln.dbias"] = ln_bwd(dout, x, w, mean, rstd)

    x, w, b = f32(rng.normal(size=(B * T, C))), f32(rng.normal(size=(F, C))), f32(rng.normal(size=F))
    dy = f32(rng.normal(size=(B * T, F)))
    out.update({"mm.inp": x, "mm.weight": w, "mm.bias": b, "mm.dout": dy,
                "mm.out": matmul_fwd(x, w, b)})
    out["mm.dinp"], out["mm.dweight"], out["mm.dbias"] = matmul_bwd(dy, x, w)

    x, d = f32(rng.normal(size=B * T * F) * 2), f32(rng.normal(size=B * T * F))
    out.update({"gelu.inp": x, "gelu.dout": d, "gelu.out": gelu_fwd(x), "gelu.dinp": gelu_bwd(x, d)})

    # Attention over two row blocks of the CPU twin (T > 64) and an odd T.
    B, T, C, NH = 2, 67, 16, 2
    out["attn.shape"] = [B, T, C, NH]
    qkv, dy = f32(rng.normal(size=(B, T, 3 * C))), f32(rng.normal(size=(B, T, C)))
    y, att = attn_fwd(qkv, NH)
    out.update({"attn.qkv": qkv, "attn.dout": dy, "attn.out": y,
                "attn.dqkv": attn_bwd(dy, qkv, att, NH)})

    # Cross-entropy, one ignored row, logits wide enough for a large max.
    N, V = 6, 13
    logits = f32(rng.normal(size=(N, V)) * 3)
    targets = rng.integers(0, V, size=N)
    targets[4] = -1
    losses, dlogits = cross_entropy(logits, targets, 0.25)
    out.update({"ce.logits": logits, "ce.targets": targets, "ce.dloss": [0.25],
                "ce.losses": losses, "ce.dlogits": dlogits})
    return out


def make_model(rng):
    cfg = dict(V=37, P=12, C=16, NH=2, L=2, F=64)
    B, T = 2, 9
    tokens = rng.integers(0, cfg["V"], size=(B, T))
    targets = rng.integers(0, cfg["V"], size=(B, T))
    targets[1, 3] = -1  # an ignored position
    params = random_params(rng, cfg)
    check_model_grads({k: v.copy() for k, v in params.items()}, tokens, targets, cfg, rng)
    out = {"config": [cfg[k] for k in ("V", "P", "C", "NH", "L", "F")] + [B, T],
           "tokens": tokens, "targets": targets}
    out.update(params)
    loss, grads = gpt_loss_and_grads(params, tokens, targets, cfg)
    out["loss"] = loss
    for k, g in grads.items():
        out["grad." + k] = g
    # Three AdamW steps (warmup, cosine, clipping on), recomputing the
    # gradient at each step's parameters. eps is 1e-5 here: the key bias's
    # gradient is zero in exact arithmetic (softmax ignores a constant added
    # to a row of scores), float32 leaves ~1e-9 of noise in it, and with a
    # tiny eps Adam turns that noise into steps of +-lr. The update math with
    # eps 1e-8 is checked in adamw.golden on given gradients.
    h = adamw_hparams(eps=1e-5)
    out["adamw.hparams"] = hparams_vector(h)
    p = {k: v.copy() for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v2 = {k: np.zeros_like(v) for k, v in p.items()}
    decay = lambda name: p[name].ndim >= 2
    for t in range(1, 4):
        loss, g = gpt_loss_and_grads(p, tokens, targets, cfg)
        out["adamw.step%d.loss" % t] = loss
        out["adamw.step%d.norm" % t] = adamw_step(h, p, g, m, v2, t, decay)
        for k in p:
            out["adamw.step%d.%s" % (t, k)] = p[k]
    return out


def make_adamw(rng):
    """AdamW alone on two tensors (a matrix that decays, a vector that does
    not) over 6 steps, crossing warmup, cosine decay and the floor; the
    gradients of step 2 are large enough to be clipped."""
    h = adamw_hparams()
    out = {"hparams": hparams_vector(h)}
    p = {"w": f32(rng.normal(size=(3, 4))), "b": f32(rng.normal(size=5))}
    out.update({"init." + k: v for k, v in p.items()})
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v2 = {k: np.zeros_like(v) for k, v in p.items()}
    for t in range(1, 7):
        g = {k: f32(rng.normal(size=v.shape) * (5.0 if t == 2 else 0.1)) for k, v in p.items()}
        for k in p:
            out["step%d.grad.%s" % (t, k)] = g[k]
        out["step%d.norm" % t] = adamw_step(h, p, g, m, v2, t, lambda k: k == "w")
        out["step%d.lr" % t] = lr_at(h, t - 1)
        for k in p:
            out["step%d.%s" % (t, k)] = p[k]
    return out


if __name__ == "__main__":
    write_golden(os.path.join(HERE, "gpt_kernels.golden"), make_kernels(np.random.default_rng(13)))
    write_golden(os.path.join(HERE, "gpt_model.golden"), make_model(np.random.default_rng(14)))
    write_golden(os.path.join(HERE, "adamw.golden"), make_adamw(np.random.default_rng(15)))
