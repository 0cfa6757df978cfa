from ...models._family import family_classes

MPTDecoderLayer, MPTModel, MPTForCausalLM = family_classes("MPT", plumbing=False)
