"""Driver of the integration tier, run as its own process (Ray owns the process).

Composes verl's real ``ppo_trainer`` config, starts real Ray and
TransferQueue, builds verl's ``LLMServerManager`` (rollout ``tracerl_cpu``:
tracerl-local's sampler in a Ray actor) and ``AgentLoopManagerTQ`` with our
loop loaded from the YAML the launcher writes, submits three prompts the way
verl's v1 trainer does, waits for their groups, and prints what landed in
TransferQueue as one JSON line prefixed ``RESULT``.

Usage: python integration_driver.py RUN_DIR AGENTS_DIR
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
import warnings

os.environ.update(
    {
        "VERL_USE_EXTERNAL_MODULES": "tracerl_verl.verl_ext",
        "TRACERL_VERL_CPU": "1",
        "VERL_PLATFORM": "cpu",
        "TORCH_COMPILE_DISABLE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
)
warnings.simplefilter("ignore")


def main(run_dir: str, agents_dir: str) -> None:
    import numpy as np
    import ray
    import torch
    import transfer_queue as tq
    import verl.trainer
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from tracerl_verl.backend import prepare_launch
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ
    from verl.utils import tensordict_utils as tu
    from verl.workers.rollout.llm_server import LLMServerManager

    from core.plugins import load_plugins
    from core.testing.fakes import compose as compose_tracerl

    data = os.path.join(run_dir, "train.jsonl")
    with open(data, "w") as f:
        f.write(json.dumps({"payload": {"mode": "two_turn"}}) + "\n")
    tcfg = compose_tracerl(
        [
            "backend=verl",
            f"run_dir={run_dir}",
            f"task.train_path={data}",
            "task.agent=verl_test_agents:app",
            f"+task.agent_env.PYTHONPATH={agents_dir}",
            "runtime.num_processes=1",
            "gateway.history_mode=tree",
            "algorithm.max_tokens=5",
        ],
        load_plugins(),
    )
    paths = prepare_launch(tcfg)
    GlobalHydra.instance().clear()
    with initialize_config_dir(
        config_dir=os.path.join(os.path.dirname(verl.trainer.__file__), "config"), version_base=None
    ):
        config = compose(
            "ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={paths.model}",
                "actor_rollout_ref.rollout.name=tracerl_cpu",
                "actor_rollout_ref.rollout.prompt_length=64",
                "actor_rollout_ref.rollout.response_length=48",
                "actor_rollout_ref.rollout.calculate_log_probs=true",
                "actor_rollout_ref.rollout.n=2",
                "actor_rollout_ref.rollout.agent.num_workers=1",
                "actor_rollout_ref.rollout.nnodes=1",
                "actor_rollout_ref.rollout.n_gpus_per_node=1",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={paths.agent_loop_yaml}",
                "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
                "trainer.n_gpus_per_node=1",
            ],
        )
    env = {
        k: os.environ[k]
        for k in (
            "VERL_USE_EXTERNAL_MODULES",
            "TRACERL_VERL_CPU",
            "VERL_PLATFORM",
            "TORCH_COMPILE_DISABLE",
            "TOKENIZERS_PARALLELISM",
        )
    }
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), agents_dir])
    ray.init(
        num_cpus=16, include_dashboard=False, runtime_env={"env_vars": env}, logging_level="ERROR"
    )
    try:
        tq.init(config.transfer_queue)
        manager = LLMServerManager.create(config)
        agent_loops = AgentLoopManagerTQ.create(config, llm_client=manager.get_client())
        modes = ["two_turn", "fork", "crash"]
        uids = [uuid.uuid4().hex for _ in modes]
        batch = tu.get_tensordict(
            {
                "dummy_tensor": torch.zeros(len(modes), 1, dtype=torch.uint8),
                # a 1-D object array of message lists (the trailing None keeps numpy from nesting)
                "raw_prompt": np.array(
                    [[{"role": "user", "content": m}] for m in modes] + [None], dtype=object
                )[:-1],
                "agent_name": np.array(["tracerl_agent"] * len(modes), dtype=object),
                "index": np.arange(len(modes)),
                "uid": np.array(uids, dtype=object),
                "tracerl_payload": np.array([json.dumps({"mode": m}) for m in modes], dtype=object),
            }
        )
        tu.assign_non_tensor_data(batch, "global_steps", 1)
        tags = [{"is_prompt": True, "status": "pending", "global_steps": 1} for _ in modes]
        tq.kv_batch_put(keys=uids, partition_id="train", tags=tags)
        start = time.time()
        agent_loops.generate_sequences(batch)
        while True:
            listing = tq.kv_list("train")
            listing = listing.get("train", listing)  # {partition: {key: tags}}
            statuses = {u: listing.get(u, {}).get("status") for u in uids}
            if all(s in ("finished", "failure") for s in statuses.values()):
                break
            if time.time() - start > 240:
                raise TimeoutError(f"groups did not finish: {statuses}")
            time.sleep(0.5)
        out: dict[str, object] = {
            "status": {m: statuses[u] for m, u in zip(modes, uids, strict=True)},
            "rows": {},
        }
        for mode, uid in zip(modes, uids, strict=True):
            keys = sorted(k for k in listing if k.startswith(uid + "_"))
            rows = []
            if keys:
                got = tq.kv_batch_get(
                    keys=keys,
                    partition_id="train",
                    select_fields=[
                        "prompts",
                        "responses",
                        "response_mask",
                        "rollout_log_probs",
                        "rm_scores",
                    ],
                )
                for i, key in enumerate(keys):
                    rows.append(
                        {
                            "key": key[len(uid) + 1 :],
                            "prompt_len": int(got["prompts"][i].numel()),
                            "mask": got["response_mask"][i].tolist(),
                            "logprobs": got["rollout_log_probs"][i].tolist(),
                            "reward": float(got["rm_scores"][i].sum()),
                            "tags": {
                                k: listing[key].get(k)
                                for k in ("status", "min_global_steps", "max_global_steps")
                            },
                        }
                    )
            out["rows"][mode] = rows  # type: ignore[index]
        stats = ray.get(manager.get_replicas()[0].servers[0].stats.remote())
        out["server"] = stats
        print("RESULT " + json.dumps(out), flush=True)
    finally:
        try:
            tq.close()
        finally:
            ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
