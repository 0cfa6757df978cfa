from ...models._family import family_classes

GemmaDecoderLayer, GemmaModel, GemmaForCausalLM = family_classes("Gemma", plumbing=False)
