"""tensorrt_llm/sampling_params.py ``SamplingParams``: a dataclass of keyword fields (an unknown one is a TypeError);
``_greedy_decoding``: ``top_k`` None or 1, ``top_p`` None or 0.0, no beams and one sequence."""

import dataclasses


@dataclasses.dataclass
class SamplingParams:
    max_tokens: int = 32
    top_k: int | None = None
    top_p: float | None = None
    temperature: float | None = None
    n: int = 1
    use_beam_search: bool = False
    end_id: int | None = None

    @property
    def _greedy_decoding(self) -> bool:
        return (self.top_k in (None, 1) and self.top_p in (None, 0.0) and not self.use_beam_search and self.n == 1)
