from ...models._family import family_classes

GPTDecoderLayer, GPTModel, GPTForCausalLM = family_classes("GPT", plumbing=True)
