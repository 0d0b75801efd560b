"""An example RL trainer against a running server, the loop SGLang trainers run: roll out groups
of completions with their logprobs on `/generate`, score them with a verifiable reward, take one
GRPO step on the trainer's own copy of the model (transformers, float32 master weights), push the
new weights into the server (its weight group over NCCL or gloo, or CUDA IPC: ops/rl/http_updates.py),
and roll out again. It checks what a trainer relies on: every reply after update k carries version
k, and the server's logprobs of the sampled tokens are the trainer's own on the same weights (teacher
forcing: the proof the weights arrived whole), within `--tolerance` (every token on a float32
server, on average on a 16-bit one).

On two GPUs, the server on GPU 1, the trainer on GPU 0 (NVLink multicast off in both):

    NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=1 python -m kernel.supervisor --data-dir /tmp/rl --model demo --port 8000 &
    NCCL_NVLS_ENABLE=0 python -m ops.rl.grpo_example --url http://127.0.0.1:8000 \\
        --model-dir /tmp/rl/models/demo --device cuda:0 --transport nccl

On the CPU: `--device cpu --transport gloo` against a server started with `--device cpu`. With
`--transport ipc` a trainer on the server's own GPU shares its memory by CUDA IPC instead (on a
CPU the shared memory's descriptors pass only between processes of one multiprocessing family,
which a trainer and a server are not). Prints one JSON line per iteration (`Iteration`).
"""

import argparse
import json
import os
import time

import msgspec
import torch
from transformers import AutoModelForCausalLM

from ops.rl.http_updates import GroupUpdates, NamedTensors, ipc_update
from ops.rl.sglang_http import SglangHttp

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off, as in every process of a group
# A float32 server computes what the trainer does: every token's logprob agrees. A 16-bit server
# rounds each weight and each sum, so a rare token's logprob can differ by tenths while the mean
# stays a few hundredths (0.04 on an H200 in bfloat16); a lost update moves the mean by the step's
# shift (`step_shift_mean`), so there the mean is what is judged.
TOLERANCE = {torch.float32: 1e-3}
TOLERANCE_16_BIT = 0.1


class Iteration(msgspec.Struct):
    """What one iteration saw and did."""

    iteration: int
    rollout_version: str  # the version every reply of the rollout carried
    reward_mean: float
    loss: float
    logprob_gap: float  # max |server's logprob - the trainer's| over the rollout's tokens, before the step
    logprob_gap_mean: float
    step_shift: float  # max |the trainer's logprob after the step - before|: what a lost update would show
    step_shift_mean: float
    pushed_version: str
    pause_s: float  # the push, from the pause of generation to its continuation
    seconds: float


class Rollout(msgspec.Struct):
    """A group-sampled batch: `tokens` [batch, new] drawn after `prompts` [batch, prompt]."""

    prompts: torch.Tensor
    tokens: torch.Tensor
    server_logprobs: torch.Tensor  # [batch, new]
    rewards: torch.Tensor  # [batch]


def rollout(http: SglangHttp, prompts: list[list[int]], args, version: str) -> Rollout:
    """`args.group_size` completions of each prompt; raises if a reply was computed by other weights
    than `version`, whole."""
    batch = [p for p in prompts for _ in range(args.group_size)]
    params = {"max_new_tokens": args.new_tokens, "temperature": 1.0, "ignore_eos": True}
    replies = http.generate(batch, params)
    for reply in replies:
        meta = reply["meta_info"]
        if meta["weight_version"] != version or meta["version_spans"] != [[0, version]]:
            raise AssertionError(f"a reply after update {version!r} came from {meta['version_spans']}")
    tokens = torch.tensor([r["output_ids"] for r in replies])
    logprobs = torch.tensor([[e[0] for e in r["meta_info"]["output_token_logprobs"]] for r in replies])
    return Rollout(torch.tensor(batch), tokens, logprobs, reward(tokens, args.target_every))


def reward(tokens: torch.Tensor, every: int) -> torch.Tensor:
    """The verifiable reward: the share of a completion's tokens that are target tokens (the ids
    divisible by `every`). [batch, new] -> [batch]"""
    return (tokens % every == 0).float().mean(dim=1)


def group_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """GRPO's: each reward against its group's mean, over the group's std. [batch] -> [batch]"""
    grouped = rewards.view(-1, group_size)
    normalised = (grouped - grouped.mean(dim=1, keepdim=True)) / (grouped.std(dim=1, keepdim=True) + 1e-6)
    return normalised.view(-1)


def token_logprobs(model, prompts: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The model's logprob of each drawn token, teacher forced. [batch, new]"""
    sequences = torch.cat([prompts, tokens], dim=1).to(model.device)  # [batch, prompt + new]
    logits = model(sequences).logits[:, prompts.shape[1] - 1 : -1].float()  # [batch, new, vocab]
    return torch.log_softmax(logits, dim=-1).gather(2, tokens.to(model.device)[..., None])[..., 0]


def grpo_loss(logprobs: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor, clip: float) -> torch.Tensor:
    """The clipped surrogate, averaged over every token: `old` are the logprobs the rollout was
    drawn with (the server's). [batch, new], [batch, new], [batch] -> []"""
    ratio = torch.exp(logprobs - old)
    advantages = advantages[:, None]
    return -torch.minimum(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages).mean()


def served_tensors(model, dtype: torch.dtype) -> NamedTensors:
    """The trainer's weights under their checkpoint names, in the served dtype (a tied head is the
    embedding, which named_parameters lists once)."""
    return [(name, p.detach().to(dtype).contiguous()) for name, p in model.named_parameters()]


def train(args) -> list[Iteration]:
    http = SglangHttp(args.url, args.admin_key)
    device = torch.device(args.device)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32).to(device)
    served_dtype = getattr(torch, http.weight_dtype("model.embed_tokens.weight"))
    tolerance = args.tolerance or TOLERANCE.get(served_dtype, TOLERANCE_16_BIT)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    group = GroupUpdates(http, args.transport, args.device) if args.transport != "ipc" else None
    generator = torch.Generator().manual_seed(args.seed)
    vocab = model.config.vocab_size
    prompts = torch.randint(0, vocab, (args.prompts, args.prompt_tokens), generator=generator).tolist()
    version = http.weight_version()
    done = []
    for k in range(1, args.iterations + 1):
        started = time.perf_counter()
        batch = rollout(http, prompts, args, version)
        advantages = group_advantages(batch.rewards, args.group_size).to(device)
        old = batch.server_logprobs.to(device)
        logprobs = token_logprobs(model, batch.prompts, batch.tokens)
        gap = (logprobs.detach() - old).abs()
        judged, what = (gap.max(), "at most") if served_dtype == torch.float32 else (gap.mean(), "on average")
        if judged > tolerance:
            raise AssertionError(
                f"the server's logprobs under {version!r} are off the trainer's by {judged:.2e} {what}"
            )
        loss = grpo_loss(logprobs, old, advantages, args.clip)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            shift = (token_logprobs(model, batch.prompts, batch.tokens) - logprobs.detach()).abs()
        pushed = str(k)
        named = served_tensors(model, served_dtype)
        if group is not None:
            answers, pause_s = group.update(named, pushed, args.bucket_mb << 20)
        else:
            answers, pause_s = ipc_update(http, named, pushed, args.bucket_mb << 20)
        if {a["weight_version"] for a in answers} != {pushed} or http.weight_version() != pushed:
            raise AssertionError(f"update {pushed} answered {answers}")
        iteration = Iteration(
            k,
            version,
            float(batch.rewards.mean()),
            loss.item(),
            float(gap.max()),
            float(gap.mean()),
            float(shift.max()),
            float(shift.mean()),
            pushed,
            pause_s,
            time.perf_counter() - started,
        )
        print(json.dumps(msgspec.to_builtins(iteration)), flush=True)
        done.append(iteration)
        version = pushed
    if group is not None:
        group.close()
    return done


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m ops.rl.grpo_example", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the server, http://HOST:PORT")
    parser.add_argument("--model-dir", required=True, help="the checkpoint the server serves: the trainer's start")
    parser.add_argument("--admin-key", default=None, help="the server's admin key, if it has API keys")
    parser.add_argument("--device", default="cpu", help="the trainer's: cuda:0, or cpu")
    parser.add_argument("--transport", default="gloo", choices=("nccl", "gloo", "ipc"))
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--target-every", type=int, default=4, help="the reward's target tokens: ids divisible by it")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--clip", type=float, default=0.2)
    parser.add_argument("--bucket-mb", type=int, default=1024, help="tensors per update request, about")
    parser.add_argument("--tolerance", type=float, default=None, help="of the logprob gap (default: by served dtype)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main() -> None:
    train(parse_args())


if __name__ == "__main__":
    main()
