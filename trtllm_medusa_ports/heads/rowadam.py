"""Adam on the rows a step touches: the heads' own lm_heads (unless ``FitOptions.dense_updates``).

A step's softmax runs over some of the vocabulary (the corpus' tokens and the step's drawn negatives), so only those
rows of a head's lm_head have a gradient. torch's AdamW still updates every row of every lm_head each step (reading
and writing the weights and both moments of the whole vocabulary: on SmolLM2-135M about half of the step's time);
this updates the step's rows alone, as sparse Adam does for an embedding ("lazy" Adam): a row's moments and value
change only on the steps that gave it a gradient, and the bias correction counts the run's steps. AdamW's decoupled
weight decay, and the decay toward the base's lm_head (``FitOptions.anchor``), apply to the same rows.
"""

from __future__ import annotations

import torch


class RowAdam:
    """Row-wise AdamW over ``params`` (each ``[V, H]``): :meth:`step` takes the step's row indices and each
    parameter's gradient on those rows."""

    def __init__(self, params: list[torch.Tensor], lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, anchor: float = 0.0,
                 anchor_to: torch.Tensor | None = None):
        self.params = params
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        #: decoupled decay toward ``anchor_to`` (``[V, H]``, the base's lm_head), as weight decay is toward 0
        self.anchor, self.anchor_to = anchor, anchor_to
        self.steps = 0
        self.exp_avg = [torch.zeros_like(p) for p in params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def step(self, rows: torch.Tensor, grads: list[torch.Tensor]) -> None:
        """One update of ``rows`` (1-D indices, each once) with ``grads[i]`` ``[len(rows), H]`` of ``params[i]``."""
        self.steps += 1
        b1, b2 = self.betas
        first, second = 1 - b1 ** self.steps, 1 - b2 ** self.steps
        for p, m_all, v_all, g in zip(self.params, self.exp_avg, self.exp_avg_sq, grads, strict=True):
            m = m_all.index_select(0, rows).mul_(b1).add_(g, alpha=1 - b1)
            v = v_all.index_select(0, rows).mul_(b2).addcmul_(g, g, value=1 - b2)
            m_all.index_copy_(0, rows, m)
            v_all.index_copy_(0, rows, v)
            w = p.index_select(0, rows)
            if self.weight_decay:
                w.mul_(1 - self.lr * self.weight_decay)
            if self.anchor:
                w.sub_(w - self.anchor_to.index_select(0, rows), alpha=self.lr * self.anchor)
            w.addcdiv_(m, v.div_(second).sqrt_().add_(self.eps), value=-self.lr / first)
            p.index_copy_(0, rows, w)

    def state_dict(self) -> dict:
        return {"steps": self.steps, "exp_avg": list(self.exp_avg), "exp_avg_sq": list(self.exp_avg_sq)}

    def load_state_dict(self, state: dict) -> None:
        moments = state["exp_avg"], state["exp_avg_sq"]
        if any(len(x) != len(self.params) or any(t.shape != p.shape for t, p in zip(x, self.params, strict=True))
               for x in moments):
            raise ValueError("the saved row-wise Adam state does not fit the heads' lm_heads")
        self.steps = int(state["steps"])
        self.exp_avg = [t.to(p.device).clone() for t, p in zip(moments[0], self.params, strict=True)]
        self.exp_avg_sq = [t.to(p.device).clone() for t, p in zip(moments[1], self.params, strict=True)]
