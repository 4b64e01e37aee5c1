"""nanoGPT's GPT in PyTorch, laid out as nanoGPT's `model.py` lays it and with dp-model's
parameter count, for the peer scripts that measure dp's GPT against PyTorch
(`torch_gpt_step.py`: one step's speed and memory; `torch_gpt_train.py`: a whole training
run's held-out loss). One definition, so that both measure the same model.

- `wte` Embedding(vocab, dim) and `wpe` Embedding(context, dim), summed, then dropout;
- `layers` pre-norm blocks: x = x + dropout(c_proj(attention(ln_1(x)))), where attention is
  one Linear(dim, 3 dim) to q, k and v (split, viewed as (B, T, heads, dim / heads),
  transposed to heads), `F.scaled_dot_product_attention(q, k, v, is_causal=True)` and the
  heads transposed back; then x = x + dropout(c_proj(gelu(c_fc(ln_2(x))))) with c_fc
  Linear(dim, 4 dim), GELU with the tanh approximation, c_proj Linear(4 dim, dim);
- a final LayerNorm and `lm_head` Linear(dim, vocab, bias=False) whose weight is `wte`'s.

Every Linear and LayerNorm has a bias. The one departure from nanoGPT is the attention
probabilities' dropout (nanoGPT passes `dropout_p` to SDPA in training): dp-model's
CausalSelfAttention has none, so neither has this model. Initialization is nanoGPT's (normal,
std 0.02; the residual projections 0.02 / sqrt(2 * layers)), as dp-model's for a language
model.
"""

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class GptConfig:
    vocab: int
    context: int
    layers: int
    heads: int
    dim: int
    dropout: float


# nanoGPT's character-level model on Shakespeare (dp's `gpt-mini`): 10,770,816 parameters.
MINI = GptConfig(vocab=65, context=256, layers=6, heads=6, dim=384, dropout=0.2)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GptConfig) -> None:
        super().__init__()
        self.heads, self.dim = config.heads, config.dim
        self.c_attn = nn.Linear(config.dim, 3 * config.dim)
        self.c_proj = nn.Linear(config.dim, config.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(self.dim, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.c_proj(y)


class Mlp(nn.Module):
    def __init__(self, config: GptConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.dim, 4 * config.dim)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * config.dim, config.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: GptConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.dim)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.dim)
        self.mlp = Mlp(config)
        self.drop_1 = nn.Dropout(config.dropout)
        self.drop_2 = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_1(self.attn(self.ln_1(x)))
        return x + self.drop_2(self.mlp(self.ln_2(x)))


class Gpt(nn.Module):
    def __init__(self, config: GptConfig = MINI) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab, config.dim)
        self.wpe = nn.Embedding(config.context, config.dim)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.dim)
        self.lm_head = nn.Linear(config.dim, config.vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(
        self, idx: torch.Tensor, targets: torch.Tensor, reduction: str = "mean"
    ) -> torch.Tensor:
        """Cross-entropy of the next tokens over all positions; targets of -1 are ignored
        (positions past the end of a partial window), as dp's labels of -1 are."""
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(
            logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1,
            reduction=reduction,
        )
