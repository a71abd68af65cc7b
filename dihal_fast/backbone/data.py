"""Training batches as a pure function of the step, so a resumed run sees exactly the same data."""

from __future__ import annotations

import numpy as np
import torch

from dihal_fast.errors import DihalValueError


class WindowSampler:
    """Fixed-length windows of ``seq_len + 1`` tokens from one token stream, shuffled per epoch.

    Epoch ``e`` shifts the window grid by a random offset and permutes the windows, both drawn from
    ``numpy.random.default_rng([seed, e])``; sample ``g = step * batch_size + j`` is window
    ``g % n_windows`` of epoch ``g // n_windows``. No state besides ``step`` is needed to resume.
    """

    def __init__(self, stream: np.ndarray, seq_len: int, batch_size: int, seed: int):
        self.n_windows = (len(stream) - 1 - seq_len) // seq_len
        if self.n_windows < 1:
            raise DihalValueError(
                f"training text has {len(stream)} tokens, too few for one window of {seq_len + 1} tokens "
                "plus an offset; give more text or a smaller --seq-len"
            )
        self.stream = torch.from_numpy(stream.astype(np.int64))
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self._epoch: tuple[int, int, np.ndarray] | None = None

    def _layout(self, epoch: int) -> tuple[int, np.ndarray]:
        if self._epoch is None or self._epoch[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            offset = int(rng.integers(self.seq_len))
            self._epoch = (epoch, offset, rng.permutation(self.n_windows))
        return self._epoch[1], self._epoch[2]

    def epoch_of(self, step: int) -> float:
        return step * self.batch_size / self.n_windows

    def batch(self, step: int) -> torch.Tensor:
        """Token ids of shape ``(batch_size, seq_len + 1)`` for the 0-based ``step``."""
        rows = []
        for g in range(step * self.batch_size, (step + 1) * self.batch_size):
            offset, perm = self._layout(g // self.n_windows)
            start = offset + int(perm[g % self.n_windows]) * self.seq_len
            rows.append(self.stream[start : start + self.seq_len + 1])
        return torch.stack(rows)
