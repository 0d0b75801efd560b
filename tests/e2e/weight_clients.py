"""slime's and AReaL's SGLang calls around a weight update and a sleep, reproduced: the routes,
bodies, retries and reads of their own code (files named below), without their frameworks around
them. Our code, not theirs. Their rollouts are in slime_client.py and rl_clients.py.

slime (THUDM/slime at 624b824): slime/backends/sglang_utils/sglang_engine.py (`SGLangEngine`:
`_make_request`, `flush_cache`, `pause_generation`, `continue_generation`, `update_weights_from_disk`,
`get_weight_version`, `release_memory_occupation`, `resume_memory_occupation`), and
slime/ray/actor_group.py (`_reload_rollout_weights_from_disk`: the order of the calls). It uses
`requests`, synchronously; the tests run it in a thread.

AReaL (inclusionAI/AReaL at 4aef98d): areal/engine/sglang_remote.py (`SGLangBackend`:
`build_disk_weight_update_requests`, `get_pause_request`, `get_resume_request`,
`get_offload_request`, `get_onload_request`) and areal/infra/remote_inf_engine.py
(`pause_generation` with its grace period, `_update_weights_from_disk`, `continue_generation`,
`offload`, `onload`, each sent with `arequest_with_retry`).
"""

import asyncio
import time

import aiohttp
import requests

from tests.e2e.rl_clients import areal_request

SLIME_FLUSH_ATTEMPTS = 60  # its loop: 60 tries, a second apart


class SlimeEngine:
    """What slime's SGLangEngine sends to one server (node rank 0)."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.flush_attempts = 0  # how many GETs the last flush took (ours, to see its retries)

    def _make_request(self, endpoint: str, payload: dict | None = None):
        response = requests.post(f"{self.base_url}/{endpoint}", json=payload or {})
        response.raise_for_status()
        return response.json()

    def flush_cache(self) -> None:
        """GET until 200: "flush cache will not return status_code 200 when there are pending requests"."""
        for attempt in range(1, SLIME_FLUSH_ATTEMPTS + 1):
            self.flush_attempts = attempt
            response = requests.get(f"{self.base_url}/flush_cache")
            if response.status_code == 200:
                return
            time.sleep(1)
        raise TimeoutError("Timeout while flushing cache.")

    def pause_generation(self) -> requests.Response:
        response = requests.post(f"{self.base_url}/pause_generation", json={})
        response.raise_for_status()
        return response

    def continue_generation(self) -> requests.Response:
        response = requests.post(f"{self.base_url}/continue_generation", json={})
        response.raise_for_status()
        return response

    def update_weights_from_disk(self, model_path: str, load_format: str | None = None, weight_version=None) -> dict:
        payload: dict = {"model_path": model_path}
        if load_format is not None:
            payload["load_format"] = load_format
        if weight_version is not None:
            payload["weight_version"] = weight_version
        return self._make_request("update_weights_from_disk", payload)

    def get_weight_version(self) -> str:
        response = requests.get(f"{self.base_url}/get_weight_version")
        response.raise_for_status()
        return response.json()["weight_version"]

    def release_memory_occupation(self) -> dict:
        self.flush_cache()
        return self._make_request("release_memory_occupation")

    def resume_memory_occupation(self, tags: list[str] | None = None) -> dict:
        return self._make_request("resume_memory_occupation", {"tags": tags})


def slime_reload_from_disk(engine: SlimeEngine, model_path: str, weight_version: str) -> str:
    """_reload_rollout_weights_from_disk, one engine: pause, flush, update, the version check its CI
    runs, continue. Returns the version the engine reports."""
    engine.pause_generation()
    engine.flush_cache()
    engine.update_weights_from_disk(model_path=model_path, weight_version=weight_version)
    version = engine.get_weight_version()
    if str(version) != str(weight_version):
        raise RuntimeError(f"Weight version mismatch after disk reload! Expected: {weight_version}; {version}")
    engine.continue_generation()
    return version


class ArealServer:
    """What AReaL's RemoteInfEngine sends to one SGLang server."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, pause_grace_period_s: float = 0.5) -> None:
        self.session, self.base_url = session, base_url
        self.pause_grace_period_s = pause_grace_period_s

    async def pause_generation(self) -> None:
        await areal_request(self.session, f"{self.base_url}/pause_generation", {})
        await asyncio.sleep(self.pause_grace_period_s)  # "waits until all requests are indeed dropped"

    async def continue_generation(self) -> None:
        await areal_request(self.session, f"{self.base_url}/continue_generation", {})

    async def update_weights_from_disk(self, path: str):
        payload = {"model_path": str(path), "abort_all_requests": True}
        return await areal_request(self.session, f"{self.base_url}/update_weights_from_disk", payload)

    async def offload(self):
        return await areal_request(self.session, f"{self.base_url}/release_memory_occupation", {})

    async def onload(self, tags: list[str] | None = None):
        payload = {"tags": tags} if tags is not None else {}
        return await areal_request(self.session, f"{self.base_url}/resume_memory_occupation", payload)

    async def update_from_disk(self, path: str):
        """The trainer's _update_weights_from_disk around the server's: pause, update, continue (only
        after an update that succeeded: a failure raises first, as it does in AReaL)."""
        await self.pause_generation()
        updated = await self.update_weights_from_disk(path)
        await self.continue_generation()
        return updated
