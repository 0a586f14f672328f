"""The joint presence model's logistic fit: sklearn's Newton-Cholesky iterations, without sklearn.

The presence model (`vce.post.engine.gate`) is a weighted binary logistic regression of a few
dozen videos on 6 features, fitted about 1,000-2,000 times per engine fit. sklearn's
`LogisticRegression(solver="newton-cholesky")` spends about 8 ms a fit, almost all of it in
input checks and bookkeeping; the arithmetic of 7 unknowns on 40 rows takes microseconds.
`newton_logistic` runs the same iterations as sklearn 1.9's `NewtonCholeskySolver` on the
same objective, so it stops at the same iterate (equal to about 1e-13; the engine's golden
record, tests/test_engine_golden.py, holds the engine's floats to 1e-6 relative between machines):

    mean_w( log(1 + e^z) - y z ) + 1 / (2 C sum(w)) |coef|^2,   z = x @ coef + intercept

(sklearn's objective divided by sum(w); the intercept is not penalised). Each iteration:

1. gradient g and Hessian H at the current point;
2. the Newton step d = -H^-1 g;
3. a backtracking line search (Armijo, sigma = 2^-11, halving up to 20 times; a step whose
   loss change is below rounding counts where the gradient's L1 norm falls);
4. stop when max |g| <= tol and the Newton decrement d H d / 2 <= tol (g at the new point, H
   at the old, as sklearn does).

Where sklearn would leave Newton for L-BFGS (an ill-conditioned Hessian, a step that does not
descend, a line search that fails) this returns None and the caller fits with sklearn itself.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit

ARMIJO = 0.00048828125  # sklearn's sigma: 1 / 2^11
LINE_STEPS = 21  # t = 1, 1/2, ..., 1/2^20
MAX_CONDITION = 1e12  # a Hessian worse than this: sklearn may leave Newton (LinAlgWarning), so let it


def _loss_gradient(x: np.ndarray, y: np.ndarray, w: np.ndarray, coef: np.ndarray, raw: np.ndarray,
                   l2: float) -> tuple[float, np.ndarray]:
    """(objective, (F + 1,) gradient) at `coef` whose linear predictor is `raw`."""
    total = w.sum()
    loss = float(np.sum(w * (np.logaddexp(0.0, raw) - y * raw)) / total)
    loss += float(0.5 * l2 * (coef[:-1] @ coef[:-1]))
    pointwise = w * (expit(raw) - y) / total
    return loss, np.append(x.T @ pointwise + l2 * coef[:-1], pointwise.sum())


def _hessian(x: np.ndarray, w: np.ndarray, raw: np.ndarray, l2: float) -> np.ndarray:
    """(F + 1, F + 1) Hessian of the objective (the last row and column: the intercept)."""
    p = expit(raw)
    pointwise = w * p * (1.0 - p) / w.sum()
    n = x.shape[1]
    hess = np.empty((n + 1, n + 1))
    hess[:n, :n] = x.T @ (pointwise[:, None] * x)
    hess[np.arange(n), np.arange(n)] += l2
    hess[:n, n] = hess[n, :n] = x.T @ pointwise
    hess[n, n] = pointwise.sum()
    return hess


def _ill_conditioned(hess: np.ndarray) -> bool:
    """np.linalg.cond(hess) > MAX_CONDITION (its ratio of singular values, a zero smallest one
    infinite), without its wrapper's checks: the fit asks once an iteration, on a 7 x 7 matrix."""
    singular = np.linalg.svd(hess, compute_uv=False)  # descending
    return not singular[-1] > 0 or singular[0] / singular[-1] > MAX_CONDITION


def newton_logistic(x: np.ndarray, y: np.ndarray, sample_weight: np.ndarray, C: float = 1.0, tol: float = 1e-4,
                    max_iter: int = 200) -> tuple[np.ndarray, float] | None:
    """(coef (F,), intercept) of the L2 logistic regression of 0/1 `y` on (N, F) `x`, each row
    weighted by `sample_weight` (> 0), as sklearn's Newton-Cholesky solver reaches it; None
    where sklearn would fall back to L-BFGS (then fit with sklearn)."""
    y, w = np.asarray(y, np.float64), np.asarray(sample_weight, np.float64)
    l2 = 1.0 / (C * w.sum())
    coef = np.zeros(x.shape[1] + 1)
    raw = x @ coef[:-1] + coef[-1]
    loss, grad = _loss_gradient(x, y, w, coef, raw, l2)
    for _ in range(max_iter):
        # 1-2. The Newton step at the current point (its gradient: the line search's last, at
        #      the point it accepted).
        hess = _hessian(x, w, raw, l2)
        if not np.isfinite(hess).all() or _ill_conditioned(hess):
            return None
        step = np.linalg.solve(hess, -grad)
        descent = float(grad @ step)
        if descent > 0:
            return None
        # 3. Backtracking line search.
        raw_step = x @ step[:-1] + step[-1]
        t, old_loss, old_grad = 1.0, loss, grad
        for _ in range(LINE_STEPS):
            trial, trial_raw = coef + t * step, raw + t * raw_step
            loss, grad = _loss_gradient(x, y, w, trial, trial_raw, l2)
            change = loss - old_loss
            if change <= t * ARMIJO * descent:
                break
            if abs(change) <= abs(old_loss * 16 * np.finfo(np.float64).eps) and \
                    np.abs(grad).sum() < np.abs(old_grad).sum():
                break
            t *= 0.5
        else:
            return None
        coef, raw = trial, trial_raw
        # 4. Converged?
        if np.max(np.abs(grad)) <= tol and 0.5 * float(step @ hess @ step) <= tol:
            break
    return coef[:-1], float(coef[-1])
