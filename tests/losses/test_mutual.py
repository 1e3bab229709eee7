"""DM2's relation matrices and transfer loss against explicit NumPy loops."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdml.losses.mutual import mutual_losses, mutual_weight, relation_matrix, transfer_loss


def _np_relation(e: np.ndarray) -> np.ndarray:
    n = len(e)
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            out[i, j] = np.sqrt(np.sum((e[i] - e[j]) ** 2))
    return out


def _np_transfer(student: np.ndarray, teacher: np.ndarray, relation: str) -> float:
    n = len(student)
    if relation == "rkd":
        off = ~np.eye(n, dtype=bool)
        student = student / student[off].mean()
        teacher = teacher / teacher[off].mean()
        total = 0.0
        for i in range(n):
            for j in range(n):
                d = abs(student[i, j] - teacher[i, j])
                total += 0.5 * d * d if d < 1 else d - 0.5
        return total / n**2
    return sum((student[i, j] - teacher[i, j]) ** 2 for i in range(n) for j in range(n)) / n**2


def _np_mutual(embeddings: np.ndarray, relation: str) -> np.ndarray:
    psi = [_np_relation(e) for e in embeddings]
    size = len(psi)
    return np.array(
        [
            sum(_np_transfer(psi[m], psi[k], relation) for k in range(size) if k != m) / (size - 1)
            for m in range(size)
        ]
    )


@pytest.fixture(scope="module")
def cohort_embeddings() -> np.ndarray:
    rng = np.random.default_rng(0)
    e = rng.normal(size=(3, 7, 5))
    e[:, 3] = e[:, 2]  # a duplicate image: a zero distance off the diagonal
    return e / np.linalg.norm(e, axis=-1, keepdims=True)


def test_relation_matrix_matches_numpy_and_has_finite_gradients(cohort_embeddings):
    e = cohort_embeddings[0]
    np.testing.assert_allclose(relation_matrix(jnp.asarray(e)), _np_relation(e), atol=1e-6)
    grad = jax.grad(lambda x: jnp.sum(relation_matrix(x)))(jnp.asarray(e, jnp.float32))
    assert np.all(np.isfinite(grad))


@pytest.mark.parametrize("relation", ["distance", "rkd"])
def test_mutual_losses_match_numpy(cohort_embeddings, relation):
    psi = jax.vmap(relation_matrix)(jnp.asarray(cohort_embeddings, jnp.float32))
    got = mutual_losses(psi, psi, 0, relation)
    np.testing.assert_allclose(got, _np_mutual(cohort_embeddings, relation), rtol=1e-5, atol=1e-7)
    # A block of members (a device's share) against the whole cohort gives the same values.
    block = mutual_losses(psi[1:], psi, 1, relation)
    np.testing.assert_allclose(block, got[1:], rtol=1e-6)


def test_peers_are_constants(cohort_embeddings):
    """d(L^l)/d(e^k) = 0 for k != l: each member learns only from its own loss."""
    e = jnp.asarray(cohort_embeddings, jnp.float32)

    def member0(x):
        psi = jax.vmap(relation_matrix)(x)
        return mutual_losses(psi, psi, 0)[0]

    grad = jax.grad(member0)(e)
    assert np.abs(grad[0]).max() > 0
    np.testing.assert_array_equal(grad[1:], 0.0)


def test_transfer_loss_by_hand():
    a = jnp.asarray([[0.0, 1.0], [1.0, 0.0]])
    b = jnp.asarray([[0.0, 3.0], [3.0, 0.0]])
    assert float(transfer_loss(a, b)) == pytest.approx((4 + 4) / 4)
    # RKD divides by the mean off-diagonal distance: equal after scaling.
    assert float(transfer_loss(a, b, "rkd")) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="unknown relation"):
        transfer_loss(a, b, "cosine")


def test_cohort_of_one_has_no_mutual_loss():
    psi = jnp.ones((1, 4, 4))
    np.testing.assert_array_equal(mutual_losses(psi, psi), [0.0])


def test_mutual_weight_warms_up_linearly():
    steps = jnp.asarray([0, 50, 150, 300, 1000])
    got = [float(mutual_weight(s, 20.0, 300)) for s in steps]
    np.testing.assert_allclose(got, [0.0, 20 / 6, 10.0, 20.0, 20.0], rtol=1e-6)
    assert float(mutual_weight(jnp.asarray(0), 20.0, 0)) == 20.0
