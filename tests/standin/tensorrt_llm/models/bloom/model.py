from ...models._family import family_classes

BloomDecoderLayer, BloomModel, BloomForCausalLM = family_classes("Bloom", plumbing=False)
