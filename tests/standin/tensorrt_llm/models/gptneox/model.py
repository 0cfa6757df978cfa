from ...models._family import family_classes

GPTNeoXDecoderLayer, GPTNeoXModel, GPTNeoXForCausalLM = family_classes("GPTNeoX", plumbing=False)
