from ...models._family import family_classes

PhiDecoderLayer, PhiModel, PhiForCausalLM = family_classes("Phi", plumbing=False)
