from ...models._family import family_classes

FalconDecoderLayer, FalconModel, FalconForCausalLM = family_classes("Falcon", plumbing=False)
