"""llama.cpp on a GGUF, in a process of its own, for the bench's llama.cpp rows.

Its own process because llama.cpp and PyTorch each keep an OpenMP-style thread pool: in one
process, or timed at once, they spin against each other on a small CPU. The bench sends one
request at a time (a JSON line: mode "plain" or "lookup", prompt token ids, max tokens, stop ids,
sampling) and waits for the answer (a JSON line: answer token ids, seconds from the start to the
first and to the last token), so nothing else runs while llama.cpp decodes.

    python -m app.bench.llamacpp_worker MODEL.gguf --threads 2 --context 4096

Prompt lookup is llama-cpp-python's `LlamaPromptLookupDecoding` with 10 tokens per draft, the
same draft length transformers' prompt lookup runs with in the bench.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

LOOKUP_TOKENS = 10


def _answer(llm, request: dict) -> dict:
    stops = set(request["stop_ids"])
    llm.reset()
    if request.get("seed") is not None:
        llm.set_seed(int(request["seed"]))
    tokens: list[int] = []
    first = last = None
    start = time.perf_counter()
    temperature = float(request.get("temperature", 0.0))
    for token in llm.generate(request["prompt_ids"], temp=temperature, top_p=float(request.get("top_p", 1.0)),
                              top_k=int(request.get("top_k", 0)) if temperature > 0 else 1,
                              repeat_penalty=1.0, reset=True):
        last = time.perf_counter() - start
        first = last if first is None else first
        if token in stops:
            break  # its pass is in the time, as Tandem's last pass is; the answer ends before it
        tokens.append(int(token))
        if len(tokens) >= request["max_tokens"]:
            break
    return {"tokens": tokens, "first_s": first or 0.0, "last_s": last or 0.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("gguf")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--context", type=int, default=4096)
    args = parser.parse_args(argv)
    import llama_cpp
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    common = dict(model_path=args.gguf, n_ctx=args.context, n_threads=args.threads, n_threads_batch=args.threads,
                  verbose=False)
    models = {"plain": Llama(**common),
              "lookup": Llama(**common, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=LOOKUP_TOKENS))}
    print(json.dumps({"ready": True, "version": llama_cpp.__version__}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        print(json.dumps(_answer(models[request["mode"]], request)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
