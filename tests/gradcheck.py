"""Central finite differences, the oracle of the gradient tests."""
import numpy as np


def fd_grad(fn, a, eps=1e-6):
    """d fn / d a by central differences, element by element (float64)."""
    g = np.zeros_like(a, dtype=np.float64)
    for i in np.ndindex(a.shape):
        ap, am = a.copy(), a.copy()
        ap[i] += eps
        am[i] -= eps
        g[i] = (fn(ap) - fn(am)) / (2 * eps)
    return g
