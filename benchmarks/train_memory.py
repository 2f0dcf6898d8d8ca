"""Peak memory of one local training step with a real vocabulary, chunked logprobs vs not.

Run from the repository root::

    python benchmarks/train_memory.py                   # the table of docs/performance.md#train_memory
    python benchmarks/train_memory.py --json out.json
    python benchmarks/train_memory.py --seq-len 512 --rows 1,2 --chunks 0,256 --long 0

The model is a Qwen2-shaped causal LM with Qwen's vocabulary (151,936 tokens)
and a tiny body (hidden 64, 2 layers), built offline from its config with
random weights: the logits, which scale with tokens x vocabulary, are what
grows, so the body is kept small enough for a laptop. Each case is one
process running one step, ``forward_backward_sync`` (the local backend's
trainer, PPO loss) then an AdamW step, on ``rows`` datums of ``seq_len``
tokens in one micro-batch; its peak is the process's peak resident memory
(``ru_maxrss``) after the step minus that before it (model, data and imports
already loaded). Chunk 0 makes the whole micro-batch's logits at once (the
trainer before ``train_logprob_chunk``); a chunk of C makes C tokens' logits
at a time. Expect the unchunked peak to grow with rows x seq_len x vocabulary
(about 4 bytes x vocabulary per token for each float32 logits tensor alive)
and the chunked one to stay near the hidden states' size plus a few chunks of
logits.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VOCAB = 151936
"""Qwen2/2.5/3's vocabulary size."""


def _rss_mib() -> float:
    """This process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one_case(rows: int, seq_len: int, chunk: int, seed: int = 0) -> dict[str, Any]:
    """Build the model and data, then run and measure one step (call in a fresh process)."""
    sys.path[:0] = [str(ROOT), str(ROOT / "plugins" / "local")]
    import torch
    from tracerl_local.losses import parse_loss_config
    from tracerl_local.training import TrainShape, forward_backward_sync
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from core.types import Datum

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=seq_len,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config).eval()
    params = sum(p.numel() for p in model.parameters())
    half = seq_len // 2
    datums = []
    for _ in range(rows):
        ids = torch.randint(0, VOCAB, (seq_len + 1,)).tolist()
        datums.append(Datum(
            model_input=ids[:-1], target_tokens=ids[1:], logprobs=[-12.0] * seq_len,
            advantages=[0.0] * half + [1.0] * (seq_len - half), weights=[0.0] * half + [1.0] * (seq_len - half),
        ))
    settings = parse_loss_config("ppo", None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    before = _rss_mib()
    start = time.perf_counter()
    result = forward_backward_sync(
        model, datums, settings, pad_id=0, cache_arg="cache",
        shape=TrainShape(micro_batch=rows, tokens_per_micro_batch=0, logprob_chunk=chunk),
    )
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - start
    return {
        "rows": rows,
        "seq_len": seq_len,
        "tokens": rows * seq_len,
        "chunk": chunk,
        "step_peak_mib": round(_rss_mib() - before, 1),
        "process_before_step_mib": round(before, 1),
        "step_s": round(seconds, 2),
        "loss": round(result.metrics["loss"], 6),
        "params_m": round(params / 1e6, 2),
    }


def _run_case(rows: int, seq_len: int, chunk: int) -> dict[str, Any]:
    args = [sys.executable, __file__, "--one", json.dumps({"rows": rows, "seq_len": seq_len, "chunk": chunk})]
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False)
    if proc.returncode:
        return {"rows": rows, "seq_len": seq_len, "chunk": chunk, "error": proc.stderr[-800:]}
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=int, default=1024, help="tokens per datum")
    parser.add_argument("--rows", default="1,4", help="datums per micro-batch, comma-separated")
    parser.add_argument("--chunks", default="0,256,1024", help="train_logprob_chunk values; 0 = unchunked")
    parser.add_argument("--long", type=int, default=8192, help="also one datum this long, chunked (0: skip)")
    parser.add_argument("--long-chunk", type=int, default=1024, help="the chunk of that long datum")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here")
    parser.add_argument("--one", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one_case(**json.loads(args.one))))
        return 0
    chunks = [int(c) for c in args.chunks.split(",")]
    cases = [(int(r), args.seq_len, c) for c in chunks for r in args.rows.split(",")]
    if args.long:
        cases.append((1, args.long, args.long_chunk))
    print(f"vocabulary {VOCAB}; one step (forward_backward + AdamW) per process; peak RSS above the process before it")
    out = []
    for rows, seq_len, chunk in cases:
        row = _run_case(rows, seq_len, chunk)
        out.append(row)
        print(json.dumps(row), flush=True)
    base = {(r["tokens"]): r for r in out if r.get("chunk") == 0 and "error" not in r}
    logits_mib = 4 * VOCAB / 2**20  # one float32 logits row
    print("\ntokens  chunk  peak MiB  peak / (tokens x vocab x 4 B)  unchunked / chunked")
    for r in out:
        if "error" in r:
            print(f"{r['rows']}x{r['seq_len']} chunk {r['chunk']}: failed\n{r['error']}")
            continue
        r["peak_per_logits_tensor"] = round(r["step_peak_mib"] / (r["tokens"] * logits_mib), 2)
        ref = base.get(r["tokens"])
        if ref is not None and r["chunk"]:
            r["unchunked_over_chunked"] = round(ref["step_peak_mib"] / r["step_peak_mib"], 1)
        print(f"{r['tokens']:>6}  {r['chunk']:>5}  {r['step_peak_mib']:>8}  {r['peak_per_logits_tensor']:>29}"
              f"  {r.get('unchunked_over_chunked', '-'):>19}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 1 if any("error" in r for r in out) else 0


if __name__ == "__main__":
    sys.exit(main())
