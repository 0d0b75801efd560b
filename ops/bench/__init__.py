"""The benchmarks: the server's GPU path on random weights of real model shapes, each figure judged
against a ceiling measured in the same run. Runnable modules:

    python -m ops.bench          decode, prefill, offline throughput and low load on the in-process
                                 engine (actors/inprocess.py); --mode http also through the whole system
    python -m ops.bench.prefix   multi-turn chat and n-sampling, prefix sharing on and off
    python -m ops.bench.gemv     batch-1 decode's matrix products: cuBLAS against gpu/gemv.py
    python -m ops.bench.invariant_matmul  --deterministic's products against the default ones, 1 to 4096 rows
    python -m ops.bench.sampler  the GPU sampler against the torch one
    python -m ops.bench.load     loading weights onto the GPU, against the disk's read rate
    python -m ops.bench.plot     the HTTP sweep's plot, from `python -m ops.bench --json`'s file
    python -m ops.bench.logprob_accuracy  our logprobs against transformers' on the same weights
    python -m ops.bench.weight_update  live weight updates (NCCL, CUDA IPC, disk, under streams)
    python -m ops.bench.sleep_wake  memory freed by sleep, wake to the next token, 20 cycles
    python -m ops.bench.kv_tier_copy  KV blocks GPU to host and back, against a pinned copy
    python -m ops.bench.stream_parsers  reading thinking and tool calls, per streamed delta (CPU)
    python -m ops.bench.grammar_host  json_schema's token masks of workload d, host side (CPU)

The rest serve them: `testbed` (the model on the device, and the ceilings), `inprocess` (the
workloads in this process), `system` (the same requests served by a real deployment over HTTP,
through `checkpoint`, `http_clients` and `process_cpu`), `requests` (requests and their timings),
`records` (the results, typed), `report` (the table and the JSON), `ceilings`, `shapes`,
`hf_baseline` (transformers on the same weights), `feature_cost` (`--feature-cost` and
`--deterministic`: a feature's cost as the same workloads with and without it) and `kernel_profile`. Importing this package
imports none of them, so each tool loads only what it uses.
"""
