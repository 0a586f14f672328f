"""`newton_logistic` reaches the iterate sklearn's Newton-Cholesky solver reaches, or defers to it."""

from __future__ import annotations

import numpy as np
import pytest

from vce.post.engine.calibration import logistic
from vce.post.engine.newton import newton_logistic


def _problem(seed: int, collinear: bool = False, separable: bool = False):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(6, 60))
    x = rng.normal(size=(n, 6)) * rng.uniform(0.1, 3, 6)
    if collinear:
        x[:, 2] = 2 * x[:, 1] + 1e-9 * rng.normal(size=n)
    gain = rng.normal(size=n) * rng.exponential(1, n)
    if separable:
        gain = np.where(x[:, 0] > 0, np.abs(gain), -np.abs(gain))
    x = (x - x.mean(axis=0)) / x.std(axis=0)
    return x, gain > 0, np.abs(gain)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("kind", ["plain", "collinear", "separable"])
def test_newton_logistic_equals_sklearns_newton_cholesky(seed, kind):
    x, y, weight = _problem(seed, kind == "collinear", kind == "separable")
    fitted = newton_logistic(x, y, weight, max_iter=200)
    model = logistic(x, y, sample_weight=weight, one_thread=False, solver="newton-cholesky", max_iter=200)
    if fitted is None:  # deferred: only where the Hessian is ill-conditioned (collinear columns)
        assert kind == "collinear"
        return
    np.testing.assert_allclose(fitted[0], model.coef_[0], rtol=1e-10, atol=1e-12)
    assert fitted[1] == pytest.approx(float(model.intercept_[0]), rel=1e-10, abs=1e-12)


def test_newton_logistic_stops_where_sklearn_stops_not_at_the_optimum():
    """Same tolerance, same iterate: a fit run to full convergence would differ in the 5th digit."""
    x, y, weight = _problem(3)
    loose, tight = newton_logistic(x, y, weight), newton_logistic(x, y, weight, tol=1e-14)
    model = logistic(x, y, sample_weight=weight, one_thread=False, solver="newton-cholesky", max_iter=200)
    assert np.allclose(loose[0], model.coef_[0], rtol=1e-10)
    assert not np.allclose(tight[0], model.coef_[0], rtol=1e-10)
