"""Validation and conversion of user matrices: the one place where bad input is caught."""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Union, overload

import numpy as np
import numpy.typing as npt

from dihal_fast.errors import DihalTypeError, DihalValueError

if TYPE_CHECKING:
    import torch

#: What the geometry functions take as ``X``: anything NumPy turns into a 2-D float array (lists, NumPy
#: arrays of float16 / float32 / float64 or ml_dtypes bfloat16) or a torch tensor (CPU or CUDA).
MatrixLike = Union[npt.ArrayLike, "torch.Tensor"]

_FLOAT_NAMES = ("float16", "bfloat16", "float32", "float64")
# Largest seed and pair count (NumPy's generators and the kernels take int64).
MAX_INT64 = 2**63 - 1


@dataclass(frozen=True)
class Matrix:
    """A validated ``n x D`` matrix: the array to hand to a backend and where it lives."""

    data: Any  # np.ndarray (float32/float64, C-contiguous) or a torch CUDA tensor
    device: str  # "cpu" or "cuda"
    source_dtype: str
    largest: float = 0.0  # max |x|

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.data.shape)


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def _dtype_name(x: Any) -> str:
    return str(x.dtype).replace("torch.", "")


def as_matrix(
    X: Any, name: str = "X", min_rows: int = 2, allow_cuda: bool = False, max_abs: float | None = None
) -> Matrix:
    """Check that ``X`` is a finite 2-D float matrix with at least ``min_rows`` rows and ``D >= 1``, and
    (unless ``max_abs`` is given: ``inf`` for callers that rescale) no value above :data:`MAX_ABS_VALUE`.

    NumPy arrays (ml_dtypes' bfloat16 included) and CPU tensors become C-contiguous float32 (from
    float16/bfloat16/float32) or float64 NumPy arrays; CUDA tensors are kept on the device when ``allow_cuda``.
    Raises ``TypeError`` for non-float, object or ragged input and ``ValueError`` for wrong shapes, too few
    rows, non-finite values or tensors the kernels cannot read (meta, other devices, sparse), naming the
    argument and the value.
    """
    if _is_torch(X):
        dtype = _dtype_name(X)
        _check_tensor_kind(X, name)
        if dtype not in _FLOAT_NAMES:
            raise DihalTypeError(f"{name} must have a floating dtype ({', '.join(_FLOAT_NAMES)}), got torch.{dtype}")
        _check_shape(tuple(X.shape), name, min_rows)
        if X.device.type == "cuda":
            largest = float(X.detach().abs().max())
            if largest != largest or largest == float("inf"):
                raise DihalValueError(
                    f"{name} contains NaN or Inf value(s); clean or mask them before computing geometry"
                )
            _check_magnitude(largest, name, max_abs)
            if not allow_cuda:
                raise DihalValueError(
                    f"{name} is a CUDA tensor; this backend runs on the CPU. Pass backend='cuda' "
                    "(or 'auto'), or move the tensor with .cpu() yourself"
                )
            return Matrix(X, "cuda", dtype, largest)
        X = X.detach()
        if dtype in ("float16", "bfloat16"):
            X = X.float()
        work = np.ascontiguousarray(X.numpy())
        return Matrix(work, "cpu", dtype, _check_values(work, name, max_abs))

    if not isinstance(X, np.ndarray):
        try:
            X = np.asarray(X)
        except (ValueError, TypeError) as exc:
            raise DihalTypeError(
                f"{name} must be a 2-D float array; could not convert {type(X).__name__}: {exc}"
            ) from None
    dtype = X.dtype.name
    # ml_dtypes' bfloat16 is a NumPy dtype of kind "V" (its own type, not a subclass of np.floating).
    if dtype not in _FLOAT_NAMES or (X.dtype.kind != "f" and dtype != "bfloat16"):
        raise DihalTypeError(f"{name} must have a floating dtype ({', '.join(_FLOAT_NAMES)}), got {X.dtype}")
    _check_shape(X.shape, name, min_rows)
    work = np.ascontiguousarray(X.astype(np.float32) if dtype in ("float16", "bfloat16") else X)
    return Matrix(work, "cpu", dtype, _check_values(work, name, max_abs))


def _check_tensor_kind(X: Any, name: str) -> None:
    """A dense tensor on the CPU or a CUDA device, or a ``DihalValueError`` naming what it is."""
    device = getattr(X.device, "type", str(X.device))
    if device not in ("cpu", "cuda"):
        hint = "a meta tensor holds no values" if device == "meta" else f"move it with {name}.cpu()"
        raise DihalValueError(
            f"{name} is a tensor on the {device!r} device; the geometry kernels read CPU and CUDA tensors ({hint})"
        )
    layout = str(getattr(X, "layout", "torch.strided"))
    if layout != "torch.strided":
        raise DihalValueError(
            f"{name} is a {layout.replace('torch.', '')} tensor; pass a dense one (e.g. {name}.to_dense())"
        )


def _max_abs(X: np.ndarray) -> float:
    """Largest |x| (NaN if any NaN): one fused pass in the compiled core, NumPy without it."""
    try:
        from dihal_fast import _native

        return float(_native.core().max_abs(X))
    except _native.BackendUnavailable:
        return float(np.abs(X).max())


def _check_values(X: np.ndarray, name: str, max_abs: float | None) -> float:
    """max |x| of a finite ``X`` within the magnitude limit; ``ValueError`` otherwise."""
    largest = _max_abs(X)
    if not np.isfinite(largest):
        bad = int((~np.isfinite(X)).sum())
        raise DihalValueError(
            f"{name} contains {bad} NaN or Inf value(s); clean or mask them before computing geometry"
        )
    _check_magnitude(largest, name, max_abs)
    return largest


# Beyond this magnitude squared distances and co-moments can overflow float64.
MAX_ABS_VALUE = 1e100


def _check_magnitude(largest: float, name: str, max_abs: float | None) -> None:
    limit = MAX_ABS_VALUE if max_abs is None else max_abs
    if largest > limit:
        raise DihalValueError(
            f"{name} has values up to {largest:.3g} in magnitude; above {limit:g} squared distances "
            "overflow float64. Rescale X (k_eff is scale-free; m_mono and m_curv scale as 1/s^2)"
        )


def _check_shape(shape: tuple, name: str, min_rows: int) -> None:
    if len(shape) != 2:
        raise DihalValueError(f"{name} must be 2-D (n tokens x D features), got shape {tuple(shape)}")
    n, D = shape
    if D < 1:
        raise DihalValueError(f"{name} must have at least one feature column, got shape {tuple(shape)}")
    if n < min_rows:
        raise DihalValueError(f"{name} needs at least {min_rows} rows, got {n} (shape {tuple(shape)})")


def check_k(k: Any, n: int) -> int:
    """``k`` must be an integer with ``1 <= k < n``."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise DihalTypeError(f"k must be an integer, got {k!r}")
    if not 1 <= int(k) < n:
        raise DihalValueError(f"k must satisfy 1 <= k < n (n = {n} rows), got k = {k}")
    return int(k)


def check_seed(seed: Any) -> int:
    """A seed is an integer in ``[0, 2^63)`` (a float, bool or string seed would silently mean another one)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise DihalTypeError(f"seed must be an integer, got {seed!r}")
    if not 0 <= int(seed) <= MAX_INT64:
        raise DihalValueError(f"seed must satisfy 0 <= seed < 2**63, got {seed}")
    return int(seed)


def check_real(value: Any, name: str) -> float:
    """A real number (Python or NumPy; not a bool or a string) as a float."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise DihalTypeError(f"{name} must be a number, got {value!r}")
    return float(value)


@overload
def check_positive(value: Any, name: str, integer: Literal[False] = False) -> float: ...
@overload
def check_positive(value: Any, name: str, integer: Literal[True]) -> int: ...
def check_positive(value: Any, name: str, integer: bool = False) -> float:
    """A finite positive number (an integer when ``integer``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise DihalTypeError(f"{name} must be a number, got {value!r}")
    if integer and not float(value).is_integer():
        raise DihalTypeError(f"{name} must be an integer, got {value!r}")
    if not np.isfinite(value) or value <= 0:
        raise DihalValueError(f"{name} must be finite and > 0, got {value!r}")
    if integer and value > MAX_INT64:
        raise DihalValueError(f"{name} must be below 2**63, got {value!r}")
    return int(value) if integer else float(value)
