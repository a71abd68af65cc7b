"""Mergeable, serialisable streaming covariance (memory O(D^2), any number of rows)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from dihal_fast.errors import DihalTypeError, DihalValueError
from dihal_fast.geometry.backends import get_backend, symmetrize_upper
from dihal_fast.geometry.inputs import MAX_ABS_VALUE, MatrixLike, as_matrix
from dihal_fast.profiling import nvtx_range

if TYPE_CHECKING:
    import torch

# "input": blocks of up to 16k rows multiply in the input precision (float32 for 16/32-bit inputs: each
# block scaled by a power of two to unit magnitude, float32-accurate, about 5e-7 relative, at any scale a
# float32 holds) and merge in float64; "float64": every product in float64, equal to np.cov of the
# input's values up to float64 rounding whatever the batch sizes (about half the speed).
PRECISIONS = ("input", "float64")


class StreamingCovariance:
    """Running count, mean and co-moment of a stream of ``batch x dim`` matrices.

    ``update`` uses Chan's pairwise update (blocks centred at their own mean, float64 merge), whatever
    the batch sizes. Precision: float64 batches, or any batch with ``precision="float64"``, give
    ``np.cov(all_rows, bias=True)`` of the batches' values up to float64 rounding; float16 / bfloat16 /
    float32 batches at the default ``precision="input"`` multiply in float32 and are float32-accurate
    (about 5e-7 relative to the largest entry), not exact. ``merge`` combines accumulators from other
    batches, processes or machines weighted by their counts; ``state_dict``/``load_state_dict``
    serialise the state exactly (float64).

    Batches that are CUDA tensors are accumulated on their GPU (the state moves there on the first
    such batch and stays, so activations never leave the device); results are NumPy arrays.
    """

    def __init__(self, dim: int, backend: str = "auto", precision: str = "input") -> None:
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
            raise DihalValueError(f"dim must be a positive integer, got {dim!r}")
        if precision not in PRECISIONS:
            raise DihalValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        self.dim = int(dim)
        self.backend = backend
        self.precision = precision
        self._count = 0
        self._mean = np.zeros(self.dim)
        self._comoment = np.zeros((self.dim, self.dim))  # upper triangle is authoritative

    @property
    def count(self) -> int:
        """Number of rows seen."""
        return self._count

    @property
    def mean(self) -> np.ndarray:
        """Mean of the rows seen (float64, ``dim``)."""
        self._require_rows()
        return self._host(self._mean).copy()

    @property
    def covariance(self) -> np.ndarray:
        """Population covariance ``sum (x - mu)(x - mu)^T / count`` (float64, symmetric)."""
        self._require_rows()
        return symmetrize_upper(self._host(self._comoment)) / self._count

    @staticmethod
    def _host(array: Any) -> np.ndarray:
        return array.cpu().numpy() if hasattr(array, "cpu") else array

    def _move_state(self, device: str, like: Any = None) -> None:
        """Keep the float64 state where the batch is: NumPy for host batches, a CUDA tensor for GPU ones."""
        on_device = hasattr(self._comoment, "cpu")
        if device == "cuda" and (not on_device or self._comoment.device != like.device):
            import torch

            self._mean = torch.as_tensor(self._host(self._mean), dtype=torch.float64, device=like.device).contiguous()
            self._comoment = torch.as_tensor(
                self._host(self._comoment), dtype=torch.float64, device=like.device
            ).contiguous()
        elif device == "cpu" and on_device:
            self._mean, self._comoment = self._host(self._mean).copy(), self._host(self._comoment).copy()

    def update(self, X: MatrixLike) -> StreamingCovariance:
        """Add the rows of ``X`` (``batch x dim``; a batch of zero rows is a no-op)."""
        shape: Any = getattr(X, "shape", None)
        if getattr(X, "ndim", None) == 2 and shape[0] == 0:
            if shape[1] != self.dim:
                raise DihalValueError(f"X has {shape[1]} columns, this accumulator has dim {self.dim}")
            return self
        matrix = as_matrix(X, "X", min_rows=1, allow_cuda=self.backend in ("auto", "cuda", "cuvs"))
        if matrix.shape[1] != self.dim:
            raise DihalValueError(f"X has {matrix.shape[1]} columns, this accumulator has dim {self.dim}")
        ops = get_backend(self.backend, matrix.device)
        data = matrix.data
        if self.precision == "float64" and data.dtype != np.float64 and str(data.dtype) != "torch.float64":
            data = data.astype(np.float64) if matrix.device == "cpu" else data.double()
        self._move_state(matrix.device, data)
        with nvtx_range("covariance"):
            self._count = ops.covariance_update(data, self._count, self._mean, self._comoment)
        return self

    def merge(self, other: StreamingCovariance) -> StreamingCovariance:
        """Fold another accumulator into this one (count-weighted pairwise update)."""
        if not isinstance(other, StreamingCovariance):
            raise DihalTypeError(f"can only merge a StreamingCovariance, got {type(other).__name__}")
        if other.dim != self.dim:
            raise DihalValueError(f"cannot merge accumulators of different dimensions ({self.dim} and {other.dim})")
        if other._count == 0:
            return self
        na, nb = self._count, other._count
        total = na + nb
        self._move_state("cpu")
        mine_mean, mine_comoment = self._mean, self._comoment
        delta = self._host(other._mean) - mine_mean
        self._comoment = (
            symmetrize_upper(mine_comoment)
            + symmetrize_upper(self._host(other._comoment))
            + np.outer(delta, delta) * (na * nb / total)
        )
        self._mean = mine_mean + delta * (nb / total)
        self._count = total
        return self

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The exact state as CPU tensors (int64 ``dim`` and ``count``, float64 ``mean`` and ``comoment``): safe
        for ``torch.save`` + ``torch.load(weights_only=True)``, ``safetensors.torch`` and ``np.savez``."""
        import torch

        return {
            "dim": torch.tensor(self.dim, dtype=torch.int64),
            "count": torch.tensor(self._count, dtype=torch.int64),
            "mean": torch.from_numpy(self._host(self._mean).copy()),
            "comoment": torch.from_numpy(symmetrize_upper(self._host(self._comoment))),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> StreamingCovariance:
        """Restore a state produced by :meth:`state_dict` (tensors, or the NumPy arrays of earlier versions);
        a corrupt one is a ``ValueError`` naming the field, and leaves this accumulator unchanged."""
        if not isinstance(state, Mapping):
            raise DihalTypeError(
                f"a covariance state is a mapping of field names to arrays, got {type(state).__name__}"
            )
        self._count, self._mean, self._comoment = _checked_state(state, self.dim)
        return self

    def _require_rows(self) -> None:
        if self._count == 0:
            raise DihalValueError("no rows have been added to this StreamingCovariance yet")

    def __repr__(self) -> str:
        return (
            f"StreamingCovariance(dim={self.dim}, count={self._count}, backend={self.backend!r}, "
            f"precision={self.precision!r})"
        )


def _as_array(value: Any, name: str) -> np.ndarray:
    """A field as a NumPy array: tensors (any device holding values) are copied to the host."""
    if hasattr(value, "detach") and type(value).__module__.startswith("torch"):
        if value.device.type == "meta":
            raise DihalValueError(f"covariance state field {name!r} is a meta tensor (it holds no values)")
        value = value.detach().cpu().numpy()
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise DihalValueError(f"covariance state is corrupt: field {name!r} is not an array ({exc})") from None


def _state_field(state: Mapping[str, Any], name: str, shape: tuple[int, ...], dim: int) -> np.ndarray:
    """Field ``name`` as a finite real array of ``shape`` (its own dtype), or a ``ValueError`` naming it."""
    value = _as_array(state[name], name)
    if value.dtype.kind not in "iuf":
        raise DihalValueError(
            f"covariance state is corrupt: field {name!r} has dtype {value.dtype}, expected real numbers"
        )
    if value.shape != shape:
        raise DihalValueError(
            f"covariance state field {name!r} has shape {value.shape}, expected {shape} (expected dim {dim})"
        )
    if not np.isfinite(value).all():
        raise DihalValueError(f"covariance state is corrupt: field {name!r} has non-finite values")
    return value


def _checked_state(state: Mapping[str, Any], dim: int) -> tuple[int, np.ndarray, np.ndarray]:
    """``(count, mean, comoment)`` of a saved state after every consistency check a real state passes."""
    missing = {"count", "mean", "comoment"} - set(state)
    if missing:
        raise DihalValueError(f"covariance state is missing {sorted(missing)}")
    if "dim" in state:
        saved_dim = _state_field(state, "dim", (), dim)
        if saved_dim != dim:
            raise DihalValueError(f"covariance state field 'dim' is {saved_dim}, expected dim {dim}")
    saved_count = _state_field(state, "count", (), dim)
    if saved_count < 0 or saved_count != np.floor(saved_count) or saved_count >= 2**63:
        raise DihalValueError(
            f"covariance state is corrupt: field 'count' is {saved_count}, expected a whole number >= 0"
        )
    count = int(saved_count)
    # Own, C-ordered float64 copies whatever the saved layout (the kernels update the state in place).
    mean = np.array(_state_field(state, "mean", (dim,), dim), dtype=np.float64, order="C", copy=True)
    comoment = np.array(_state_field(state, "comoment", (dim, dim), dim), dtype=np.float64, order="C", copy=True)
    if np.abs(mean).max(initial=0.0) > MAX_ABS_VALUE:
        raise DihalValueError(
            f"covariance state is corrupt: field 'mean' has values up to {np.abs(mean).max():.3g}, above the "
            f"{MAX_ABS_VALUE:g} no batch can have"
        )
    if count == 0 and (mean.any() or comoment.any()):
        raise DihalValueError("covariance state is corrupt: field 'count' is 0 but 'mean' or 'comoment' is non-zero")
    if count == 1 and comoment.any():
        raise DihalValueError(
            "covariance state is corrupt: field 'count' is 1 but 'comoment' is non-zero (one row has no spread)"
        )
    scale = np.abs(comoment).max(initial=0.0)
    if np.abs(comoment - comoment.T).max(initial=0.0) > 1e-9 * scale:
        raise DihalValueError("covariance state is corrupt: field 'comoment' is not symmetric")
    if (np.diag(comoment) < 0).any():
        raise DihalValueError("covariance state is corrupt: field 'comoment' has a negative diagonal (sums of squares)")
    _check_positive_semidefinite(comoment)
    return count, mean, comoment


def _check_positive_semidefinite(comoment: np.ndarray) -> None:
    """A co-moment is a sum of outer products: no eigenvalue below -(rounding), else a ``ValueError``.

    Rounding of an accumulated co-moment stays far below ``1e-8 * D * max|c|``; a corruption such as
    ``|c01| > sqrt(c00 c11)`` gives an eigenvalue of the order of the entries themselves."""
    scale = np.abs(comoment).max(initial=0.0)
    if scale == 0:
        return
    lowest = float(np.linalg.eigvalsh(comoment / scale)[0])  # scaled: no overflow near the float64 limit
    if lowest < -1e-8 * comoment.shape[0]:
        raise DihalValueError(
            f"covariance state is corrupt: field 'comoment' is not positive semi-definite (an eigenvalue "
            f"of {lowest * scale:.3g}, entries up to {scale:.3g})"
        )
