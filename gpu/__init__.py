"""The compute: model code, paged KV cache, attention backends, sampler and model builder.

Plain torch objects with no networking or asyncio; the executor actor drives them through
`gpu.runner.ModelRunner`.
"""
