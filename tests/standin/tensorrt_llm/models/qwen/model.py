from ...models._family import family_classes

QWenDecoderLayer, QWenModel, QWenForCausalLM = family_classes("QWen", plumbing=True)
