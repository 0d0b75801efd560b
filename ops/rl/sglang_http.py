"""A trainer's HTTP client for SGLang's routes, as an RL trainer calls them on an SGLang server (and
so on this one: docs/api.md, "Live weights"): rollouts on `/generate` with logprobs, the weight
group, updates, pauses and the weight version. Standard library only (http.client), so it runs where
neither `openai` nor `requests` is installed; every call blocks, so a trainer may run one in a
thread while it broadcasts the tensors that call announced.

Each thread keeps its connection open between calls: a trainer sends an update per bucket, and a
new connection per request (urllib's way) costs about a millisecond of each.
"""

import http.client
import json
import threading
import urllib.parse

UPDATE_TIMEOUT_S = 900.0  # an update may first wait for the requests in flight (SGLang's default)


class ServerError(RuntimeError):
    """The server answered with an error status, or with `success: false`."""

    def __init__(self, route: str, status: int, body: str) -> None:
        super().__init__(f"{route}: HTTP {status}: {body[:2000]}")
        self.status = status


class SglangHttp:
    def __init__(self, base_url: str, admin_key: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._address = urllib.parse.urlsplit(self.base_url)
        self.headers = {"Content-Type": "application/json"}
        if admin_key:
            self.headers["Authorization"] = f"Bearer {admin_key}"
        self._connections = threading.local()

    def call(self, method: str, route: str, body: dict | None = None, timeout_s: float = 120.0) -> dict:
        """The JSON answer of one route; ServerError on an error status or `success: false`."""
        data = None if body is None else json.dumps(body).encode()
        status, _, raw = self._exchange(method, route, data, timeout_s)
        if status >= 400:
            raise ServerError(route, status, raw.decode(errors="replace"))
        answer = json.loads(raw or b"{}")
        if isinstance(answer, dict) and answer.get("success") is False:
            raise ServerError(route, 200, json.dumps(answer))
        return answer

    def _exchange(self, method: str, route: str, data: bytes | None, timeout_s: float):
        """(status, headers, body) of one request on this thread's connection. A kept connection the
        server has closed since (idle) fails before the server reads anything: sent again once, on a
        new one."""
        try:
            return self._send(method, route, data, timeout_s)
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            self._connections.open.close()
            self._connections.open = None
            return self._send(method, route, data, timeout_s)

    def _send(self, method: str, route: str, data: bytes | None, timeout_s: float):
        connection = self._connection(timeout_s)
        connection.request(method, self._address.path + route, data, self.headers)
        response = connection.getresponse()
        return response.status, response.headers, response.read()

    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        connection = getattr(self._connections, "open", None)
        if connection is None:
            connection = http.client.HTTPConnection(self._address.hostname, self._address.port, timeout=timeout_s)
            self._connections.open = connection
        connection.timeout = timeout_s
        if connection.sock is not None:
            connection.sock.settimeout(timeout_s)
        return connection

    def generate(self, input_ids: list[list[int]], sampling_params: dict, timeout_s: float = 600.0) -> list[dict]:
        """One batch of prompts (SGLang's list form of `input_ids`), with the output tokens'
        logprobs: per prompt `output_ids`, `meta_info.output_token_logprobs` ([logprob, id, text]
        each) and the versions of the weights that computed them."""
        body = {"input_ids": input_ids, "sampling_params": sampling_params, "return_logprob": True}
        answer = self.call("POST", "/generate", body, timeout_s)
        return answer if isinstance(answer, list) else [answer]

    def weight_version(self) -> str:
        return self.call("GET", "/get_weight_version")["weight_version"]

    def weight_dtype(self, name: str) -> str:
        """The dtype the server serves weight `name` in ("bfloat16"): what an update must send."""
        return self._weight_headers(name)["X-Weight-Dtype"]

    def weight_checksum(self, name: str) -> str:
        """gpu/weight_check.py's checksum of weight `name` as served, to compare with the trainer's."""
        return self._weight_headers(name)["X-Weight-Checksum"]

    def _weight_headers(self, name: str):
        route = f"/get_weights_by_name?name={urllib.parse.quote(name)}&truncate_size=1"
        status, headers, raw = self._exchange("GET", route, None, 60.0)
        if status >= 400:
            raise ServerError(route, status, raw.decode(errors="replace"))
        return headers

    def pause(self, mode: str = "abort") -> dict:
        return self.call("POST", "/pause_generation", {"mode": mode})

    def resume(self) -> dict:
        return self.call("POST", "/continue_generation", {})

    def init_group(self, master_address: str, master_port: int, world_size: int, backend: str) -> dict:
        """The server joins the trainer's group at rank 1 (the trainer is 0); answers once all joined."""
        body = {
            "master_address": master_address,
            "master_port": master_port,
            "rank_offset": 1,
            "world_size": world_size,
            "backend": backend,
        }
        return self.call("POST", "/init_weights_update_group", body, UPDATE_TIMEOUT_S)

    def destroy_group(self) -> dict:
        return self.call("POST", "/destroy_weights_update_group", {})

    def update_distributed(self, request: dict, version: str, **options) -> dict:
        """`request`: ops/rl/weight_push.py's update_request (names, dtypes, shapes, load_format,
        checksums); `options`: SGLang's abort_all_requests, flush_cache, or pause_mode."""
        body = {**request, "weight_version": version, **options}
        return self.call("POST", "/update_weights_from_distributed", body, UPDATE_TIMEOUT_S)

    def update_tensor(self, serialized: list[str], flattened: bool, version: str, **options) -> dict:
        """`serialized`: base64 strings of gpu/ipc_tensors.py's ipc_payload, SGLang's form."""
        body = {
            "serialized_named_tensors": serialized,
            "load_format": "flattened_bucket" if flattened else None,
            "weight_version": version,
            **options,
        }
        return self.call("POST", "/update_weights_from_tensor", body, UPDATE_TIMEOUT_S)

    def update_disk(self, model_path: str, version: str, **options) -> dict:
        body = {"model_path": model_path, "weight_version": version, **options}
        return self.call("POST", "/update_weights_from_disk", body, UPDATE_TIMEOUT_S)
