from ...models._family import family_classes

LLaMADecoderLayer, LLaMAModel, LLaMAForCausalLM = family_classes("LLaMA", plumbing=True)
