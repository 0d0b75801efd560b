"""A trainer's whole weight update, as SGLang trainers (slime, AReaL) run it over HTTP: the tensors
cut into buckets of about `bucket_bytes`, each bucket one update request, all of them under one
pause of generation so that no request is computed under half-new weights, then continue.

Two transports: the trainer's weight group (`GroupUpdates`: it joins as rank 0 through
ops/rl/weight_push.py, the server at rank 1 through `/init_weights_update_group`; each bucket is
announced by `/update_weights_from_distributed` while the trainer broadcasts it, one flattened
broadcast), and CUDA IPC from a trainer on the server's own device (`ipc_update`: each bucket
`/update_weights_from_tensor` with handles to the trainer's memory; on a CPU, shared memory).
"""

import base64
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from kernel.nats_server import free_port
from ops.rl.sglang_http import SglangHttp
from ops.rl.weight_push import WeightPusher, ipc_payload, update_request

NamedTensors = list[tuple[str, torch.Tensor]]


def buckets(named: NamedTensors, bucket_bytes: int) -> list[NamedTensors]:
    """The tensors in order, cut into runs of at most `bucket_bytes` (a larger tensor alone)."""
    out: list[NamedTensors] = [[]]
    size = 0
    for name, tensor in named:
        if out[-1] and size + tensor.nbytes > bucket_bytes:
            out.append([])
            size = 0
        out[-1].append((name, tensor))
        size += tensor.nbytes
    return out


def paused(http: SglangHttp, mode: str | None, send_buckets) -> tuple[list[dict], float]:
    """Runs `send_buckets()` (it returns the update answers) under one pause in `mode` (None: no
    pause; each request then pauses as it is told); the answers and the pause-to-resume seconds:
    from the pause's request to the continue's answer."""
    started = time.perf_counter()
    if mode is not None:
        http.pause(mode)
    try:
        answers = send_buckets()
    finally:
        if mode is not None:
            http.resume()
    return answers, time.perf_counter() - started


class GroupUpdates:
    """Rank 0 of a weight group with one server, over `backend` (nccl on a GPU, gloo on the CPU)."""

    def __init__(
        self,
        http: SglangHttp,
        backend: str,
        device: str,
        master_address: str = "127.0.0.1",
        timeout_s: float = 120.0,
    ) -> None:
        self.http, self.timeout_s = http, timeout_s
        port = free_port()
        with ThreadPoolExecutor(1) as pool:  # both sides return once the other has joined
            joined = pool.submit(http.init_group, master_address, port, 2, backend)
            self.pusher = WeightPusher(port, 2, master_address, backend=backend, device=device, timeout_s=timeout_s)
            joined.result()

    def update(
        self,
        named: NamedTensors,
        version: str,
        bucket_bytes: int,
        pause_mode: str | None = "in_place",
        checksums: bool = True,
        **options,
    ) -> tuple[list[dict], float]:
        """Sends `named` as version `version`; the answers (one per bucket) and the pause-to-resume
        seconds. `options`: the update requests' own (flush_cache...)."""
        requests = [(b, update_request(b, flattened=True, checksums=checksums)) for b in buckets(named, bucket_bytes)]

        def send_buckets() -> list[dict]:
            answers = []
            with ThreadPoolExecutor(1) as pool:
                for bucket, request in requests:  # the request waits for the broadcast it announces
                    answer = pool.submit(self.http.update_distributed, request, version, **options)
                    self.pusher.push(bucket, flattened=True, timeout_s=self.timeout_s)
                    answers.append(answer.result())
            return answers

        return paused(self.http, pause_mode, send_buckets)

    def close(self) -> None:
        self.http.destroy_group()


def ipc_update(
    http: SglangHttp,
    named: NamedTensors,
    version: str,
    bucket_bytes: int,
    pause_mode: str | None = "in_place",
    **options,
) -> tuple[list[dict], float]:
    """Shares `named` with a server on the same device as version `version`, one flattened bucket
    per request; the answers and the pause-to-resume seconds. The tensors must stay unchanged until
    this returns: the server copies from them."""
    payloads = [base64.b64encode(ipc_payload(b, flattened=True)).decode() for b in buckets(named, bucket_bytes)]

    def send_buckets() -> list[dict]:
        return [http.update_tensor([payload], True, version, **options) for payload in payloads]

    return paused(http, pause_mode, send_buckets)
