"""More of RLX's optimizers, on the public `Optimizer.update` extension point.

Purpose
-------
NAdamW, RAdam, LAMB, Adafactor and Muon, each written twice in the same
float32 op order: ``_update`` (NumPy, in place: the oracle) and ``update``
(graph ops for the compiled train step).  Per-step constants come from
``scalars(t, lr)`` in float64, rounded to float32 once, as in rlxc/optim.py;
t-dependent ones use only arithmetic, ``**`` and ``select`` so that
``rlxc compile --train`` can compute them in C.  Re-exported by rlxc.optim.

Update rules (p param, g grad, t update number, wd weight decay, decoupled)
---------------------------------------------------------------------------
NAdamW(lr, betas, eps, wd)   (optax's nadamw: Nesterov momentum in Adam)
    m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g
    m_nes = b1/(1-b1**(t+1)) * m + (1-b1)/(1-b1**t) * g;  v_hat = v/(1-b2**t)
    p -= lr * (m_nes / (sqrt(v_hat) + eps) + wd*p)
RAdam(lr, betas, eps, wd)    (Liu et al. 2020, as PyTorch's RAdam, decoupled decay)
    m, v as Adam;  m_hat = m/(1-b1**t)
    rho_inf = 2/(1-b2) - 1;  rho_t = rho_inf - 2 t b2**t/(1-b2**t)
    rho_t > 5: r = sqrt((rho_t-4)(rho_t-2)rho_inf / ((rho_inf-4)(rho_inf-2)rho_t))
               u = m_hat * r * sqrt(1-b2**t) / (sqrt(v) + eps)
    otherwise: u = m_hat          (the switch is a host-side scalar: a select)
    p -= lr * (u + wd*p)
LAMB(lr, betas, eps, wd)     (You et al. 2020)
    u = m_hat / (sqrt(v_hat) + eps) + wd*p   (Adam moments and corrections)
    trust = |p| / |u| when both norms (float32 sums) are > 0, else 1
    p -= (lr * trust) * u
Adafactor(lr, beta1=0, decay_rate=-0.8, eps1=1e-30, clip_threshold=1, wd)
    (Shazeer & Stern 2018, fixed lr as HF's relative_step=False)
    b2t = 1 - t**decay_rate;  g2 = g*g + eps1
    2-D (factored, slots r (rows,), c (cols,)):
        r = b2t*r + (1-b2t)*mean(g2, axis 1);  c = b2t*c + (1-b2t)*mean(g2, axis 0)
        u = g / (sqrt(r/mean(r))[:, None] * sqrt(c)[None, :])
    else (slot v, like p):  v = b2t*v + (1-b2t)*g2;  u = g / sqrt(v)
    u = u / max(rms(u) / clip_threshold, 1);  beta1 > 0: m = b1*m + (1-b1)*u, u = m
    p -= lr * (u + wd*p)
Muon(lr, momentum=0.95, nesterov, ns_steps=5, betas, eps, wd)  (Jordan et al. 2024)
    2-D: m = mu*m + g;  u = g + mu*m (nesterov) or m
         X = u (transposed when rows > cols) / (|u| + 1e-7)
         ns_steps times: A = X X^T;  B = b*A + c*(A A);  X = a*X + B X
                         (a, b, c) = (3.4445, -4.7750, 2.0315)
         p -= lr * (X (transposed back) * sqrt(max(1, rows/cols)) + wd*p)
    other params: AdamW with betas, eps and wd
A slot a param does not use (Adafactor's v of a matrix, its r and c of a
vector, Muon's v of a matrix) has shape (1,) and passes through unchanged.
"""
from __future__ import annotations

import numpy as np

from .optim import Optimizer, check_betas, check_nonneg, check_unit, select

__all__ = ["NAdamW", "RAdam", "LAMB", "Adafactor", "Muon"]

_F32 = np.float32
_ONE = _F32(1.0)
# Newton-Schulz quintic coefficients of Muon (Keller Jordan's)
NS_COEFFS = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7


def _adam_hp(cls, hp: dict) -> dict[str, float]:
    name = cls.__name__
    return {"lr": check_nonneg(name, "lr", hp["lr"]),
            "beta1": check_unit(name, "beta1", hp["beta1"]),
            "beta2": check_unit(name, "beta2", hp["beta2"]),
            "eps": check_nonneg(name, "eps", hp["eps"]),
            "weight_decay": check_nonneg(name, "weight_decay", hp["weight_decay"])}


def _adam_scalars(hp: dict, t, lr) -> dict:
    b1, b2 = hp["beta1"], hp["beta2"]
    return {"lr": lr, "b1": b1, "omb1": 1.0 - b1, "b2": b2, "omb2": 1.0 - b2,
            "bc1": 1.0 - b1 ** t, "bc2": 1.0 - b2 ** t, "eps": hp["eps"],
            "wd": hp["weight_decay"]}


def _moments_np(g, st, s):
    m, v = st["m"], st["v"]
    np.multiply(m, s["b1"], out=m)
    np.add(m, s["omb1"] * g, out=m)
    np.multiply(v, s["b2"], out=v)
    np.add(v, s["omb2"] * (g * g), out=v)
    return m, v


def _moments(g, st, s):
    m = st["m"] * s["b1"]
    m = m + s["omb1"] * g
    v = st["v"] * s["b2"]
    v = v + s["omb2"] * (g * g)
    return m, v


class _AdamFamily(Optimizer):
    """Shared constructor and validation: lr, betas, eps, decoupled weight decay."""

    slot_names = ("m", "v")
    numeric_hps = ("beta1", "beta2", "eps", "weight_decay")

    def __init__(self, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01):
        b1, b2 = check_betas(type(self).__name__, betas)
        super().__init__(lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=weight_decay)

    @classmethod
    def _validate_hp(cls, hp):
        return _adam_hp(cls, hp)

    betas = property(lambda self: (self._hp["beta1"], self._hp["beta2"]))


class NAdamW(_AdamFamily):
    """Adam with Nesterov momentum and decoupled weight decay (optax's nadamw)."""

    kind = "nadamw"

    def scalars(self, t, lr):
        b1, b2 = self._hp["beta1"], self._hp["beta2"]
        return {"lr": lr, "b1": b1, "omb1": 1.0 - b1, "b2": b2, "omb2": 1.0 - b2,
                "c1": b1 / (1.0 - b1 ** (t + 1)), "c2": (1.0 - b1) / (1.0 - b1 ** t),
                "bc2": 1.0 - b2 ** t, "eps": self._hp["eps"], "wd": self._hp["weight_decay"]}

    def _update(self, p, g, st, s):
        m, v = _moments_np(g, st, s)
        m_nes = s["c1"] * m + s["c2"] * g
        v_hat = v / s["bc2"]
        u = m_nes / (np.sqrt(v_hat) + s["eps"])
        if self._hp["weight_decay"]:
            u = u + s["wd"] * p
        np.subtract(p, s["lr"] * u, out=p)

    def update(self, b, p, g, st, s):
        m, v = _moments(g, st, s)
        m_nes = s["c1"] * m + s["c2"] * g
        v_hat = v / s["bc2"]
        u = m_nes / (v_hat.sqrt() + s["eps"])
        if self._hp["weight_decay"]:
            u = u + s["wd"] * p
        return p - s["lr"] * u, {"m": m, "v": v}


class RAdam(_AdamFamily):
    """Rectified Adam (variance-rectified adaptive step, SGD-like warm-up)."""

    kind = "radam"

    def __init__(self, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0):
        super().__init__(lr, betas=betas, eps=eps, weight_decay=weight_decay)

    def scalars(self, t, lr):
        out = _adam_scalars(self._hp, t, lr)
        b2 = self._hp["beta2"]
        rho_inf = 2.0 / (1.0 - b2) - 1.0
        bc2 = out.pop("bc2")
        out.pop("eps"), out.pop("wd")
        r, rect = 0.0, 0.0
        if rho_inf > 5.0:  # otherwise rho_t <= rho_inf never passes 5
            rho_t = rho_inf - 2.0 * t * b2 ** t / bc2
            ok = rho_t > 5.0
            ratio = ((rho_t - 4.0) * (rho_t - 2.0) * rho_inf
                     / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t))
            r = select(ok, ratio, 0.0) ** 0.5
            rect = select(ok, 1.0, 0.0)
        out.update({"sbc2": bc2 ** 0.5, "r": r, "rect": rect, "eps": self._hp["eps"],
                    "wd": self._hp["weight_decay"]})
        return out

    def _update(self, p, g, st, s):
        m, v = _moments_np(g, st, s)
        m_hat = m / s["bc1"]
        if s["rect"] > 0:
            u = m_hat * s["r"] * (s["sbc2"] / (np.sqrt(v) + s["eps"]))
        else:
            u = m_hat
        if self._hp["weight_decay"]:
            u = u + s["wd"] * p
        np.subtract(p, s["lr"] * u, out=p)

    def update(self, b, p, g, st, s):
        m, v = _moments(g, st, s)
        m_hat = m / s["bc1"]
        rect = m_hat * s["r"] * (s["sbc2"] / (v.sqrt() + s["eps"]))
        u = b.where(s["rect"].gt(0.0), rect, m_hat)
        if self._hp["weight_decay"]:
            u = u + s["wd"] * p
        return p - s["lr"] * u, {"m": m, "v": v}


class LAMB(_AdamFamily):
    """Adam direction scaled per tensor by the trust ratio |p| / |update|."""

    kind = "lamb"

    def scalars(self, t, lr):
        return _adam_scalars(self._hp, t, lr)

    def _update(self, p, g, st, s):
        m, v = _moments_np(g, st, s)
        u = (m / s["bc1"]) / (np.sqrt(v / s["bc2"]) + s["eps"])
        if self._hp["weight_decay"]:
            u = u + s["wd"] * p
        pn = np.sqrt(np.sum(p * p))
        un = np.sqrt(np.sum(u * u))
        trust = pn / un if (pn > 0 and un > 0) else _ONE
        np.subtract(p, (s["lr"] * trust) * u, out=p)

    def update(self, b, p, g, st, s):
        m, v = _moments(g, st, s)
        u = (m / s["bc1"]) / ((v / s["bc2"]).sqrt() + s["eps"])
        if self._hp["weight_decay"]:
            u = u + s["wd"] * p
        pn = (p * p).sum().sqrt()
        un = (u * u).sum().sqrt()
        one = b.scalar(1.0)
        trust = b.where(pn.gt(0.0), b.where(un.gt(0.0), pn / un, one), one)
        return p - (s["lr"] * trust) * u, {"m": m, "v": v}


class Adafactor(Optimizer):
    """Adafactor: factored second moments (row and column means) for 2-D params."""

    kind = "adafactor"
    numeric_hps = ("decay_rate", "eps1", "clip_threshold", "beta1", "weight_decay")

    def __init__(self, lr: float, beta1: float = 0.0, decay_rate: float = -0.8,
                 eps1: float = 1e-30, clip_threshold: float = 1.0, weight_decay: float = 0.0):
        super().__init__(lr=lr, beta1=beta1, decay_rate=decay_rate, eps1=eps1,
                         clip_threshold=clip_threshold, weight_decay=weight_decay)

    @classmethod
    def _validate_hp(cls, hp):
        dr = float(hp["decay_rate"])
        if not -1.0 <= dr < 0.0:
            raise ValueError(f"Adafactor: decay_rate must be in [-1, 0), got {hp['decay_rate']!r}")
        ct = check_nonneg("Adafactor", "clip_threshold", hp["clip_threshold"])
        if ct == 0.0:
            raise ValueError("Adafactor: clip_threshold must be > 0")
        return {"lr": check_nonneg("Adafactor", "lr", hp["lr"]),
                "beta1": check_unit("Adafactor", "beta1", hp["beta1"]),
                "decay_rate": dr,
                "eps1": check_nonneg("Adafactor", "eps1", hp["eps1"]),
                "clip_threshold": ct,
                "weight_decay": check_nonneg("Adafactor", "weight_decay", hp["weight_decay"])}

    @classmethod
    def _slots_for(cls, hp):
        return ["r", "c", "v"] + (["m"] if hp["beta1"] else [])

    def slot_shape(self, slot, shape):
        shape = tuple(shape)
        factored = len(shape) == 2
        if slot == "r":
            return (shape[0],) if factored else (1,)
        if slot == "c":
            return (shape[1],) if factored else (1,)
        if slot == "v":
            return (1,) if factored else shape
        return shape

    def scalars(self, t, lr):
        b2t = 1.0 - t ** self._hp["decay_rate"]
        b1 = self._hp["beta1"]
        return {"lr": lr, "b2t": b2t, "omb2": 1.0 - b2t, "eps1": self._hp["eps1"],
                "d": self._hp["clip_threshold"], "b1": b1, "omb1": 1.0 - b1,
                "wd": self._hp["weight_decay"]}

    def _update(self, p, g, st, s):
        g2 = g * g + s["eps1"]
        if p.ndim == 2:
            r, c = st["r"], st["c"]
            np.multiply(r, s["b2t"], out=r)
            np.add(r, s["omb2"] * np.mean(g2, axis=1), out=r)
            np.multiply(c, s["b2t"], out=c)
            np.add(c, s["omb2"] * np.mean(g2, axis=0), out=c)
            rn = r / np.mean(r)
            u = g / (np.sqrt(rn)[:, None] * np.sqrt(c)[None, :])
        else:
            v = st["v"]
            np.multiply(v, s["b2t"], out=v)
            np.add(v, s["omb2"] * g2, out=v)
            u = g / np.sqrt(v)
        rms = np.sqrt(np.mean(u * u))
        u = u / np.maximum(rms / s["d"], _ONE)
        if "m" in st:
            m = st["m"]
            np.multiply(m, s["b1"], out=m)
            np.add(m, s["omb1"] * u, out=m)
            u = m
        if self._hp["weight_decay"]:
            u = u + s["wd"] * p
        np.subtract(p, s["lr"] * u, out=p)

    def update(self, b, p, g, st, s):
        g2 = g * g + s["eps1"]
        out = dict(st)
        if p.ndim == 2:
            r = st["r"] * s["b2t"]
            r = r + s["omb2"] * g2.mean(1)
            c = st["c"] * s["b2t"]
            c = c + s["omb2"] * g2.mean(0)
            rn = r / r.mean()
            u = g / (rn.sqrt().reshape(p.shape[0], 1) * c.sqrt().reshape(1, p.shape[1]))
            out.update(r=r, c=c)
        else:
            v = st["v"] * s["b2t"]
            v = v + s["omb2"] * g2
            u = g / v.sqrt()
            out["v"] = v
        rms = (u * u).mean().sqrt()
        u = u / (rms / s["d"]).maximum(1.0)
        if "m" in st:
            m = st["m"] * s["b1"]
            m = m + s["omb1"] * u
            u = out["m"] = m
        if self._hp["weight_decay"]:
            u = u + s["wd"] * p
        return p - s["lr"] * u, out


class Muon(Optimizer):
    """Muon: Newton-Schulz orthogonalized momentum for 2-D params, AdamW for the rest."""

    kind = "muon"
    slot_names = ("m", "v")
    numeric_hps = ("momentum", "beta1", "beta2", "eps", "weight_decay")

    def __init__(self, lr: float, momentum: float = 0.95, nesterov: bool = True,
                 ns_steps: int = 5, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01):
        b1, b2 = check_betas("Muon", betas)
        super().__init__(lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps,
                         beta1=b1, beta2=b2, eps=eps, weight_decay=weight_decay)

    @classmethod
    def _validate_hp(cls, hp):
        out = _adam_hp(cls, hp)
        steps = hp["ns_steps"]
        if isinstance(steps, bool) or not float(steps).is_integer() or not 1 <= steps <= 20:
            raise ValueError(f"Muon: ns_steps must be an integer in [1, 20], got {steps!r}")
        out.update(momentum=check_unit("Muon", "momentum", hp["momentum"]),
                   nesterov=1.0 if hp["nesterov"] else 0.0, ns_steps=float(steps))
        return out

    def slot_shape(self, slot, shape):
        return (1,) if slot == "v" and len(shape) == 2 else tuple(shape)

    def scalars(self, t, lr):
        return {"mu": self._hp["momentum"], **_adam_scalars(self._hp, t, lr)}

    @staticmethod
    def _scale(shape) -> float:
        return max(1.0, shape[0] / shape[1]) ** 0.5

    def _update(self, p, g, st, s):
        wd = self._hp["weight_decay"]
        if p.ndim != 2:  # AdamW
            m, v = _moments_np(g, st, s)
            u = (m / s["bc1"]) / (np.sqrt(v / s["bc2"]) + s["eps"])
        else:
            m = st["m"]
            np.multiply(m, s["mu"], out=m)
            np.add(m, g, out=m)
            u = g + s["mu"] * m if self._hp["nesterov"] else m
            a, b_, c = (_F32(x) for x in NS_COEFFS)
            tr = p.shape[0] > p.shape[1]
            x = u.T if tr else u
            x = x / (np.sqrt(np.sum(x * x)) + _F32(NS_EPS))
            for _ in range(int(self._hp["ns_steps"])):
                A = x @ x.T
                B = b_ * A + c * (A @ A)
                x = a * x + B @ x
            u = (x.T if tr else x) * _F32(self._scale(p.shape))
        if wd:
            u = u + s["wd"] * p
        np.subtract(p, s["lr"] * u, out=p)

    def update(self, b, p, g, st, s):
        wd = self._hp["weight_decay"]
        if p.ndim != 2:
            m, v = _moments(g, st, s)
            u = (m / s["bc1"]) / ((v / s["bc2"]).sqrt() + s["eps"])
            out = {"m": m, "v": v}
        else:
            m = st["m"] * s["mu"]
            m = m + g
            u = g + s["mu"] * m if self._hp["nesterov"] else m
            a, b_, c = NS_COEFFS
            tr = p.shape[0] > p.shape[1]
            x = u.T if tr else u
            x = x / ((x * x).sum().sqrt() + NS_EPS)
            for _ in range(int(self._hp["ns_steps"])):
                A = x @ x.T
                B = b_ * A + c * (A @ A)
                x = a * x + B @ x
            u = (x.T if tr else x) * self._scale(p.shape)
            out = {"m": m, "v": st["v"]}
        if wd:
            u = u + s["wd"] * p
        return p - s["lr"] * u, out
