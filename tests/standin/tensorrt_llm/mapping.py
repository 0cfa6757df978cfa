"""tensorrt_llm/mapping.py ``Mapping``: rank = pp_rank * tp_size + tp_rank."""


class Mapping:
    def __init__(self, world_size=1, rank=0, gpus_per_node=8, *, tp_size=1, pp_size=1, cp_size=1, moe_tp_size=-1,
                 moe_ep_size=-1, **kwargs):
        if world_size != tp_size * pp_size * cp_size:
            raise ValueError(f"world_size must equal to tp_size * pp_size * cp_size, but got "
                             f"{world_size} != {tp_size} * {pp_size} * {cp_size}")
        self.world_size, self.gpus_per_node = world_size, gpus_per_node
        self.tp_size, self.pp_size, self.cp_size = tp_size, pp_size, cp_size
        # -1: pure tensor parallelism for the experts; their product must be tp_size
        if moe_tp_size == -1 and moe_ep_size == -1:
            moe_tp_size, moe_ep_size = tp_size, 1
        elif moe_tp_size == -1:
            moe_tp_size = tp_size // moe_ep_size
        elif moe_ep_size == -1:
            moe_ep_size = tp_size // moe_tp_size
        if moe_tp_size * moe_ep_size != tp_size:
            raise ValueError(f"tp_size must equal to moe_tp_size * moe_ep_size, but got {tp_size} != "
                             f"{moe_tp_size} * {moe_ep_size}")
        self.moe_tp_size, self.moe_ep_size = moe_tp_size, moe_ep_size
        self.rank = rank

    # upstream's ``rank`` is a property whose setter checks the value (its tp/pp/moe ranks are derived from it;
    # this stand-in derives them here), so ``PretrainedConfig.set_rank`` (``self.mapping.rank = rank``) keeps
    # every size, the MoE ones included
    @property
    def rank(self):
        return self._rank

    @rank.setter
    def rank(self, rank):
        if not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValueError(f"Rank should be an integer between 0 and {self.world_size - 1}, but got {rank}.")
        self._rank = rank
        self.tp_rank = rank % self.tp_size
        self.pp_rank = rank // self.tp_size
        self.tp_group = [self.pp_rank * self.tp_size + i for i in range(self.tp_size)]
        self.moe_ep_rank, self.moe_tp_rank = self.tp_rank % self.moe_ep_size, self.tp_rank // self.moe_ep_size
        self.pp_group = [self.tp_rank + i * self.tp_size for i in range(self.pp_size)]

    def is_first_pp_rank(self):
        return self.pp_rank == 0

    def prev_pp_rank(self):
        return self.rank - self.tp_size

    def next_pp_rank(self):
        return self.rank + self.tp_size

    def is_last_pp_rank(self):
        return self.pp_rank == self.pp_size - 1

    def has_pp(self):
        return self.pp_size > 1

    def pp_layers(self, num_layers):
        # contiguous, nearly equal chunks; the first stages take the remainder
        base, extra = divmod(num_layers, self.pp_size)
        start = self.pp_rank * base + min(self.pp_rank, extra)
        return list(range(start, start + base + (1 if self.pp_rank < extra else 0)))

    def to_dict(self):
        return {"world_size": self.world_size, "tp_size": self.tp_size, "pp_size": self.pp_size,
                "moe_tp_size": self.moe_tp_size, "moe_ep_size": self.moe_ep_size}
