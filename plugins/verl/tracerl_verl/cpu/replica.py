"""Rollout ``tracerl_cpu``: a verl replica whose server is tracerl-local's batching sampler.

Defines ``LocalSamplerServer`` (a Ray actor honouring the server contract
verl's ``LLMServerClient`` and ``CheckpointEngineManager`` call) and
``LocalReplica`` (a ``RolloutReplica`` launching it), registered under
``tracerl_cpu`` through ``RolloutReplicaRegistry``.

Like verl's vLLM server, the server reports ``stop_reason="completed"`` for
both a stop and a length finish, so the adapter's finish-reason inference is
exercised for real. Its ``global_steps`` is the version of the weights the
trainer last pushed (``load_state_dict``).
"""

from __future__ import annotations

import asyncio
from typing import Any

SERVER_NAME = "tracerl_cpu_server_{rank}"


class LocalSamplerServer:
    """The policy served on CPU by ``tracerl_local.sampler.LocalSampler``."""

    def __init__(
        self, model_path: str, max_positions: int, response_length: int, seed: int = 0
    ) -> None:
        import torch
        from tracerl_local.sampler import LocalSampler
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(1)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.sampler = LocalSampler(
            self.model,
            tokenizer,
            max_positions=max_positions,
            max_batch_size=64,
            batch_wait_ms=2.0,
            seed=seed,
        )
        self.response_length = response_length
        self.global_steps = 0
        self.calls = 0
        self.weight_loads = 0

    async def generate(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        from core.types import SamplingParams

        params = dict(sampling_params)
        max_tokens = int(
            params.pop("max_tokens", 0) or params.pop("max_new_tokens", 0) or self.response_length
        )
        request = SamplingParams(
            max_tokens=max_tokens,
            temperature=float(params.get("temperature", 1.0)),
            top_p=float(params.get("top_p", 1.0)),
            top_k=int(params.get("top_k", -1)),
            stop=tuple(params.get("stop") or ()),
            stop_token_ids=tuple(params.get("stop_token_ids") or ()),
        )
        self.calls += 1
        result = await self.sampler.sample(list(prompt_ids), request, session_id=request_id)
        return TokenOutput(
            token_ids=list(result.token_ids),
            log_probs=list(result.logprobs) if params.get("logprobs") else None,
            stop_reason="completed",
            num_preempted=0,
            extra_fields={"global_steps": result.weight_version},
        )

    async def load_state_dict(self, state_dict: dict[str, Any], global_steps: int) -> None:
        """Serve new weights from the next batch on (called by the trainer-side adapter)."""
        missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
        if unexpected or [k for k in missing if "lm_head" not in k]:
            raise RuntimeError(
                f"weight sync mismatch: missing={missing[:5]} unexpected={unexpected[:5]}"
            )
        self.sampler.publish(self.model, int(global_steps))
        self.global_steps = int(global_steps)
        self.weight_loads += 1

    def stats(self) -> dict[str, int]:
        return {
            "calls": self.calls,
            "weight_loads": self.weight_loads,
            "global_steps": self.global_steps,
        }

    # control methods verl's replica manager calls; there is no KV cache to manage
    async def wake_up(self) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def abort_all_requests(self, reject_request: bool = False) -> None:
        return None

    async def resume_generation(self) -> None:
        return None


def register() -> None:
    import ray
    from verl.workers.rollout.replica import RolloutMode, RolloutReplica, RolloutReplicaRegistry

    class LocalReplica(RolloutReplica):  # type: ignore[misc]
        """One CPU server actor; hybrid mode reuses it (``init_hybrid`` calls ``launch_servers``)."""

        async def init_standalone(self) -> None:
            # the base class builds a GPU resource pool for standalone servers
            self.rollout_mode = RolloutMode.STANDALONE
            await self.launch_servers()

        async def launch_servers(self) -> None:
            cfg = self.config
            actor = (
                ray.remote(num_cpus=0)(LocalSamplerServer)
                .options(name=SERVER_NAME.format(rank=self.replica_rank), max_concurrency=256)
                .remote(
                    self.model_config.local_path
                    if getattr(self.model_config, "local_path", None)
                    else self.model_config.path,
                    int(cfg.prompt_length) + int(cfg.response_length),
                    int(cfg.response_length),
                )
            )
            await asyncio.wrap_future(
                actor.stats.remote().future()
            )  # fail here if the model cannot load
            self.servers = [actor]
            self._server_handle = actor
            # no HTTP endpoint: verl's LLMServerClient talks to the actor over Ray
            self._server_address = f"ray://{SERVER_NAME.format(rank=self.replica_rank)}"

    RolloutReplicaRegistry.register("tracerl_cpu", lambda: LocalReplica)
