"""The conditional diffusion bridge: rebuilds the hidden state ``h_l`` from the embedding output ``c(x)``.

Design. ``h_l`` of a causal LM is a deterministic function of the prefix ``x_1..x_i``, so all context has
to flow through the condition; the noisy state needs no cross-position mixing. The bridge therefore has

* a causal **context encoder** over ``c(x)`` (rotary causal self-attention blocks, width ``W``; by default
  one block per replaced layer), run once per token and cached, so a new token costs one position; and
* a per-position **UNet denoiser** over the feature dimension (``W -> W/2 -> ... -> W/2^depth`` and back,
  skip connections between matching widths, the context injected at every width, FiLM on a sinusoidal
  time embedding), run ``nfe`` times per token. It is a few matrix products on one position, much cheaper
  than a transformer layer, which is what makes few-step sampling fast.

Generation cost. The default is one denoiser evaluation (``nfe = 1``: the DDIM step from ``t = 1``, trained
through that same unroll by the reconstruction and distillation losses; the diffusion loss keeps every ``t``
usable, so more steps stay available with ``nfe``), one context block per replaced layer and a UNet of
depth 1. On the shipped backbone (``l* = 1``, 200 steps, validation PPL over the backbone's): the old
default (2 steps, 2 blocks, depth 2) 1.085; 1 step 1.078; 1 step and 1 block 1.084; and depth 1 1.093
(depth 0: 1.120); torch calls per generated token 957 (old code) -> 654 against the backbone's 607.
``bench/bench_bridge_speed.py`` measures tokens/s and PPL of these variants together.

Copied backbone layers. With ``copied_layers = k > 0`` the context encoder starts with the backbone's own
decoder layers ``1..k`` (its architecture, rotary positions, masks and KV cache; weights copied from the
backbone, frozen unless ``train_copied_layers``), followed by ``layer - k`` of the bridge's blocks by default,
and the denoiser predicts ``x0`` as the normalised ``h_k`` plus a learned correction (its output layer starts
at zero, so ``k = layer`` starts as the backbone itself). ``k = 0`` is the paper's bridge, everything learned
from ``c(x)``. ``dihal replace`` copies ``layer - 1`` layers by default: on a real model (SmolLM2-135M,
``l* = 3``) the paper's bridge stays far from the backbone at a CPU budget, one learned layer does not
(README, "Real checkpoints").

Output ``i`` depends on ``c(x_1..x_i)`` and ``z_{t,i}`` only. Targets are normalised per layer,
``z = (h - mean) / std`` with the teacher's per-dimension mean and either one scalar std (the root mean
per-dimension variance: an isotropic rescaling that keeps the layer's geometry and makes ``E|z|^2 / D = 1``) or,
with ``target_dim_std``, one std per dimension (``dihal replace --target-scaling``: a few massive-activation
dimensions of a real model hold almost all of ``h_l``'s variance, and under one scalar the losses see little else).
Validation reports the squared error over the scalar std either way: the fraction of variance unexplained.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from transformers import AutoConfig, AutoModel, DynamicCache

from dihal_fast.bridge.layers import ContextBlock, FiLMBlock, KVCache, Modulation, rotary_tables, sinusoidal_embedding
from dihal_fast.bridge.samplers import make_sampler
from dihal_fast.bridge.schedules import Prediction, make_schedule
from dihal_fast.common.decoder_layers import block_output, layer_list
from dihal_fast.common.serial import SerialConfig
from dihal_fast.errors import DihalValueError


@dataclass
class BridgeConfig(SerialConfig):
    """Architecture, diffusion process and target statistics of a bridge (saved as JSON beside it)."""

    hidden_size: int  # D of the rebuilt hidden state h_l
    condition_size: int  # size of the condition c(x)
    layer: int  # index l of the rebuilt hidden state (output of backbone layer l)
    width: int = 0  # W of context encoder and denoiser; 0 = hidden_size
    context_layers: int = -1  # -1 = one block per replaced layer the bridge learns (= layer - copied_layers)
    copied_layers: int = 0  # backbone layers 1..k copied into the context encoder (0 = all learned from c(x))
    train_copied_layers: bool = False  # train the copied layers with the bridge (default: frozen)
    copied_config: dict = field(default_factory=dict)  # HF config of the copied layers (set by the hybrid)
    heads: int = 0  # 0 = width // 64 (at least 1)
    mlp_ratio: int = 2
    unet_depth: int = 1  # halvings of the width in the denoiser's down path
    time_dim: int = 128
    schedule: str = "cosine"
    prediction: str = "x0"
    sampler: str = "ddim"
    nfe: int = 1  # one step: at l* = 1 every extra evaluation costs more than the layer it replaces
    target_mean: list[float] = field(default_factory=list)  # per-dimension mean of h_l (teacher)
    target_std: float = 1.0  # sqrt(mean per-dimension variance of h_l)
    target_dim_std: list[float] = field(default_factory=list)  # per-dimension divisors of z (empty: target_std)
    condition_rms: float = 1.0  # root mean square of c(x): brings the condition to unit scale

    def __post_init__(self) -> None:
        self.width = self.width or self.hidden_size
        learned = max(0, self.layer - self.copied_layers)
        self.context_layers = learned if self.context_layers == -1 else self.context_layers
        self.heads = self.heads or max(1, self.width // 64)
        if not self.target_mean:
            self.target_mean = [0.0] * self.hidden_size
        checks = {
            "hidden_size": self.hidden_size > 0,
            "condition_size": self.condition_size > 0,
            "layer": self.layer >= 1,
            "context_layers": self.context_layers >= 0,
            "copied_layers": 0 <= self.copied_layers <= self.layer,
            "mlp_ratio": self.mlp_ratio >= 1,
            "unet_depth": self.unet_depth >= 0 and self.width // 2**self.unet_depth >= 1,
            "time_dim": self.time_dim >= 2 and self.time_dim % 2 == 0,
            "nfe": self.nfe >= 1,
            "target_std": self.target_std > 0,
            "condition_rms": self.condition_rms > 0,
            "target_mean": len(self.target_mean) == self.hidden_size,
            "target_dim_std": len(self.target_dim_std) in (0, self.hidden_size)
            and all(v > 0 for v in self.target_dim_std),
        }
        for name, ok in checks.items():
            if not ok:
                hint = f" (the replaced layers are 1..{self.layer})" if name == "copied_layers" else ""
                raise DihalValueError(f"invalid bridge config: {name} = {getattr(self, name)!r}{hint}")
        if self.width % self.heads or (self.width // self.heads) % 2:
            raise DihalValueError(f"bridge width {self.width} must split into {self.heads} heads of even size")
        Prediction(self.prediction).check_schedule(make_schedule(self.schedule))
        make_sampler(self.sampler)
        if self.copied_layers and self.prediction != "x0":
            raise DihalValueError(
                f"copied_layers = {self.copied_layers} needs prediction 'x0' (the denoiser corrects the copied "
                f"layers' h in x0 space), got {self.prediction!r}"
            )


class BridgeCache:
    """What incremental decoding reuses: keys and values of the context encoder for the tokens seen so far
    (one entry per block) and the denoiser's FiLM modulations per sampler time (weights are fixed while
    decoding, and a sampler visits the same few times at every token)."""

    def __init__(self, layers: int):
        self.layers: list[KVCache | None] = [None] * layers
        self.copied: DynamicCache | None = None  # the copied backbone layers' own cache (created at first use)
        self.modulations: dict[float, list[Modulation]] = {}

    @property
    def length(self) -> int:
        if self.copied is not None:
            return self.copied.get_seq_length()
        first = self.layers[0] if self.layers else None
        return 0 if first is None else first[0].shape[2]


def position_noise(seed: int, positions: Tensor, draws: int, dim: int, shared_rows: bool = False) -> Tensor:
    """Standard normal ``(draws, B, T, dim)`` noise that depends only on ``(seed, position, row)``, or on
    ``(seed, position)`` alone with ``shared_rows`` (every row sees the same draw at a position).

    Drawing per position (not per call) makes incremental generation see exactly the noise that a full
    recompute of the same sequence sees, whatever the chunking; ``shared_rows`` also makes a row's noise
    independent of its place in a batch (deterministic scoring).
    """
    batch, length = positions.shape
    unique, inverse = torch.unique(positions.cpu(), return_inverse=True)
    rows = 1 if shared_rows else batch
    tables = torch.stack(
        [
            torch.randn(
                rows,
                draws,
                dim,
                generator=torch.Generator().manual_seed((seed * 1_000_003 + position * 7919) % (2**63 - 1)),
            )
            for position in unique.tolist()
        ]
    )  # (U, rows, draws, dim)
    row_index = torch.zeros(batch, 1, dtype=torch.long) if shared_rows else torch.arange(batch)[:, None]
    return tables[inverse, row_index].permute(2, 0, 1, 3).contiguous().to(positions.device)  # (draws, B, T, dim)


class Bridge(nn.Module):
    """Context encoder + UNet denoiser; see the module docstring. Shapes: ``(B, T, ...)``."""

    def __init__(self, config: BridgeConfig):
        super().__init__()
        self.config = config
        self.schedule = make_schedule(config.schedule)
        self.prediction = Prediction(config.prediction)
        width = config.width
        widths = [width // 2**level for level in range(config.unet_depth + 1)]
        # No per-token normalisation on the paths from c(x) to the output (only the global condition_rms):
        # h_l = c(x) + layer updates, and the norms of the embeddings differ by token and must reach the
        # prediction (a LayerNorm would erase them).
        self.copied = copied_model(config)
        self.condition_in = nn.Linear(config.condition_size, width)
        self.context = nn.ModuleList(
            ContextBlock(width, config.heads, config.mlp_ratio) for _ in range(config.context_layers)
        )
        self.context_to_level = nn.ModuleList(nn.Linear(width, w) for w in widths)
        self.time_mlp = nn.Sequential(nn.Linear(config.time_dim, config.time_dim), nn.SiLU())
        self.noisy_in = nn.Linear(config.hidden_size, width)
        self.down_blocks = nn.ModuleList(FiLMBlock(w, config.time_dim, config.mlp_ratio) for w in widths[:-1])
        self.downs = nn.ModuleList(nn.Linear(widths[i], widths[i + 1]) for i in range(config.unet_depth))
        self.middle = FiLMBlock(widths[-1], config.time_dim, config.mlp_ratio)
        self.ups = nn.ModuleList(nn.Linear(widths[i + 1], widths[i]) for i in range(config.unet_depth))
        self.up_blocks = nn.ModuleList(FiLMBlock(w, config.time_dim, config.mlp_ratio) for w in widths[:-1])
        self.out = nn.Linear(width, config.hidden_size)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)
        # Plain float32 tensors, not buffers: a bf16 cast of the module must not round the statistics.
        self.target_mean = torch.tensor(config.target_mean, dtype=torch.float32)
        self.target_std = float(config.target_std)
        self.target_scale = self._config_scale()

    @property
    def dtype(self) -> torch.dtype:
        return self.noisy_in.weight.dtype

    def set_target_statistics(self, mean: Tensor, std: float, dim_std: Tensor | None = None) -> None:
        """Store the teacher's per-dimension mean and scalar std of ``h_l``, and the per-dimension divisors of
        ``z`` when given (default: the scalar std for every dimension); in the config, saved with it."""
        size = self.config.hidden_size
        if mean.shape != (size,) or not std > 0 or (dim_std is not None and dim_std.shape != (size,)):
            raise DihalValueError(
                f"need a mean of shape ({size},) and std > 0, got {tuple(mean.shape)} and {std}"
                + ("" if dim_std is None else f" (per-dimension std {tuple(dim_std.shape)})")
            )
        self.target_mean, self.target_std = mean.detach().float().cpu(), float(std)
        self.config.target_mean, self.config.target_std = [float(v) for v in self.target_mean.tolist()], float(std)
        self.config.target_dim_std = [] if dim_std is None else [float(v) for v in dim_std.tolist()]
        self.target_scale = self._config_scale()

    def _config_scale(self) -> Tensor | None:
        """The per-dimension divisors of ``z`` ``(D,)`` in float32 from the config (None: the scalar std), on the
        CPU even under a meta-device creation (they are config, not weights)."""
        dim_std = self.config.target_dim_std
        return torch.tensor(dim_std, dtype=torch.float32, device="cpu") if dim_std else None

    def _mean_on(self, device: torch.device) -> Tensor:
        """The target mean on ``device``; rebuilt from the config when the module was created on the meta
        device (transformers' ``from_pretrained`` does: the statistics are config, not weights)."""
        if self.target_mean.is_meta:
            self.target_mean = torch.tensor(self.config.target_mean, dtype=torch.float32, device="cpu")
        return self.target_mean.to(device)

    def _scale_on(self, device: torch.device) -> Tensor | float:
        """The per-dimension divisors of ``z`` on ``device``, or the scalar std."""
        return self.target_std if self.target_scale is None else self.target_scale.to(device)

    def normalize(self, hidden: Tensor) -> Tensor:
        """``z = (h - mean) / std`` in float32 (``std`` per dimension or one scalar)."""
        return (hidden.float() - self._mean_on(hidden.device)) / self._scale_on(hidden.device)

    def denormalize(self, z: Tensor) -> Tensor:
        """``h = z std + mean`` in float32."""
        return z.float() * self._scale_on(z.device) + self._mean_on(z.device)

    def encode(
        self, condition: Tensor, positions: Tensor, key_mask: Tensor | None = None, cache: BridgeCache | None = None
    ) -> list[Tensor]:
        """Per-level context features ``[(B, T, W / 2^k)]`` from ``c(x)``, followed by the normalised ``h_k``
        of the copied layers when there are any (the denoiser's ``x0`` skip); extends ``cache`` in place."""
        skip = None
        if self.copied is None:
            x = self.condition_in((condition / self.config.condition_rms).to(self.dtype))
        else:
            skip = self.normalize(self.copied_hidden_state(condition, positions, key_mask, cache))
            x = self.condition_in(skip.to(self.dtype))
        rotary = (
            rotary_tables(positions, self.config.width // self.config.heads, self.dtype) if len(self.context) else None
        )
        for index, block in enumerate(self.context):
            x, kv = block(x, rotary, key_mask, cache.layers[index] if cache is not None else None)
            if cache is not None:
                cache.layers[index] = kv
        levels = [project(x) for project in self.context_to_level]
        return levels if skip is None else [*levels, skip]

    def copied_hidden_state(
        self, condition: Tensor, positions: Tensor, key_mask: Tensor | None, cache: BridgeCache | None
    ) -> Tensor:
        """``h_k`` ``(B, T, D)`` of the copied backbone layers on ``c(x)`` (before the model's final norm),
        continuing ``cache.copied``."""
        assert self.copied is not None
        if cache is not None and cache.copied is None:
            cache.copied = DynamicCache(config=self.copied.config)
        captured: list[Tensor] = []
        layers = layer_list(self.copied)
        assert layers is not None  # a transformers base model of the backbone's family (copied_model)
        last = layers[-1]
        handle = last.register_forward_hook(lambda module, args, output: captured.append(block_output(output)))
        try:
            self.copied(
                inputs_embeds=condition.to(self.dtype),
                attention_mask=None if key_mask is None else key_mask.long(),
                position_ids=positions,
                cache=cache.copied if cache is not None else None,
                use_cache=cache is not None,
            )
        finally:
            handle.remove()
        return captured[-1]

    def modulations(self, t: Tensor) -> list[Modulation]:
        """FiLM modulations of the denoiser's blocks (down path, middle, up path) at time ``t`` (0-d or ``(B, T)``)."""
        time = self.time_mlp(sinusoidal_embedding(t, self.config.time_dim).to(self.dtype))
        blocks = [*self.down_blocks, self.middle, *self.up_blocks]
        return [block.modulation(time) for block in blocks]

    def denoise(
        self, z: Tensor, t: Tensor, context: list[Tensor], modulations: list[Modulation] | None = None
    ) -> Tensor:
        """Network output (in the config's prediction type) for noisy ``z`` ``(B, T, D)`` at time ``t``.

        ``t`` is 0-d (one time for all positions) or ``(B, T)``; ``modulations`` are ``self.modulations(t)``
        when the caller already has them.
        """
        down, middle, up = self._split(modulations if modulations is not None else self.modulations(t))
        x = self.noisy_in(z.to(self.dtype)) + context[0]
        skips = []
        for level, (block, project) in enumerate(zip(self.down_blocks, self.downs)):
            x = block(x, down[level])
            skips.append(x)
            x = project(x) + context[level + 1]
        x = self.middle(x, middle)
        for level in reversed(range(len(self.ups))):
            x = self.up_blocks[level](self.ups[level](x) + skips[level], up[level])
        out = self.out(x).float()
        return out + context[-1].float() if len(context) > len(self.context_to_level) else out

    def _split(self, modulations: list[Modulation]) -> tuple[list[Modulation], Modulation, list[Modulation]]:
        depth = self.config.unet_depth
        return modulations[:depth], modulations[depth], modulations[depth + 1 :]

    def sample(
        self,
        context: list[Tensor],
        noise: Tensor,
        nfe: int | None = None,
        sampler: str | None = None,
        cache: BridgeCache | None = None,
    ) -> Tensor:
        """Normalised ``x0`` ``(B, T, D)`` from ``noise`` ``(draws, B, T, D)`` (draw 0 starts the chain);
        with ``cache``, the modulations of each sampler time are computed once and kept there."""
        chosen = make_sampler(sampler or self.config.sampler)

        def model(z: Tensor, t: Tensor) -> Tensor:
            if cache is None:
                return self.denoise(z, t, context)
            key = float(t)
            if key not in cache.modulations:
                cache.modulations[key] = self.modulations(t)
            return self.denoise(z, t, context, cache.modulations[key])

        return chosen.sample(model, self.schedule, self.prediction, noise[0], nfe or self.config.nfe, noise[1:])

    def forward(
        self,
        condition: Tensor,
        positions: Tensor,
        noisy: Tensor,
        t: Tensor,
        noise: Tensor,
        key_mask: Tensor | None = None,
        nfe: int | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Training pass: ``(denoiser output at (noisy, t), sampled normalised x0 from noise)``."""
        context = self.encode(condition, positions, key_mask)
        return self.denoise(noisy, t, context), self.sample(context, noise, nfe)


def copied_model(config: BridgeConfig) -> nn.Module | None:
    """The copied backbone layers as a transformers base model of ``copied_layers`` layers (float32, weights
    to be copied in by the caller; a one-row token embedding, as the bridge feeds ``c(x)`` as ``inputs_embeds``),
    or ``None`` when nothing is copied."""
    if not config.copied_layers:
        return None
    if not config.copied_config.get("model_type"):
        raise DihalValueError("copied_layers > 0 needs copied_config, the copied layers' Hugging Face config")
    settings = dict(config.copied_config)
    hf_config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    model = AutoModel.from_config(hf_config, dtype=torch.float32)
    model.requires_grad_(config.train_copied_layers)
    return model.eval()  # no dropout, as in the teacher (HybridLM.train keeps it so)
