from ...models._family import family_classes

Phi3DecoderLayer, Phi3Model, Phi3ForCausalLM = family_classes("Phi3", plumbing=False)
