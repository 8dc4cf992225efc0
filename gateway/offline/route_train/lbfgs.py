"""Limited-memory BFGS in numpy, for the tier router's smooth convex losses (no scipy)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

Vector = npt.NDArray[np.float64]


def minimise(
    objective: Callable[[Vector], tuple[float, Vector]],
    start: Vector,
    iterations: int,
    memory: int = 10,
    tolerance: float = 1e-6,
) -> Vector:
    """Limited-memory BFGS with a backtracking (Armijo) line search: enough for a smooth
    convex loss, and no scipy."""
    x = start.copy()
    value, gradient = objective(x)
    steps: list[tuple[Vector, Vector, float]] = []  # (s, y, 1 / y.s)
    for _ in range(iterations):
        direction = -_two_loop(gradient, steps)
        slope = float(gradient @ direction)
        if slope >= 0:  # not a descent direction: forget the curvature, go downhill
            steps.clear()
            direction, slope = -gradient, -float(gradient @ gradient)
        step = 1.0
        while True:
            candidate = x + step * direction
            new_value, new_gradient = objective(candidate)
            if new_value <= value + 1e-4 * step * slope or step < 1e-10:
                break
            step *= 0.5
        s, y = candidate - x, new_gradient - gradient
        curvature = float(s @ y)
        if curvature > 1e-12:
            steps.append((s, y, 1.0 / curvature))
            del steps[:-memory]
        x, value, gradient = candidate, new_value, new_gradient
        if float(np.abs(gradient).max()) < tolerance:
            break
    return x


def _two_loop(gradient: Vector, steps: list[tuple[Vector, Vector, float]]) -> Vector:
    q = gradient.copy()
    alphas = []
    for s, y, rho in reversed(steps):
        alpha = rho * float(s @ q)
        alphas.append(alpha)
        q -= alpha * y
    if steps:
        s, y, _ = steps[-1]
        q *= float(s @ y) / float(y @ y)
    for (s, y, rho), alpha in zip(steps, reversed(alphas), strict=True):
        q += s * (alpha - rho * float(y @ q))
    return q
