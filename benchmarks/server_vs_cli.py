"""The local server's tokens/s next to the CLI's: the same pair, the same prompts, one run.

The CLI path is what `tandem-cli generate` does: a request to the runner service, its events read
on the client's thread, in the one process. The server path is what an editor does: the official
`openai` client, in a process of its own, streaming a chat completion from `tandem-cli serve`'s
app on a loopback port. Each is timed as its client sees it:
answer tokens after the first over the wall clock from the first token to the last (the decode
rate the bench and the panel report), plus time to first token. Both answer from the server's
kept caches. The two alternate, prompt by prompt, so a slow moment of the machine falls on both.

    python benchmarks/server_vs_cli.py --model demo --backend torch --prompts 4 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

SUITE = Path(__file__).resolve().parent / "suite.json"


def _cli(service, messages, max_tokens):
    """(time to first token, decode tokens/s, text) through the service, as tandem-cli generate."""
    from app.engine.events import Finished
    from app.engine.sampling import SamplingParams
    from app.runner import ChatRequest
    from app.service import Traced

    # the server's conversation: both paths answer from the same kept caches (a quantized target
    # rounds a reused prefix and a fresh prefill differently, which could change near-ties)
    request = ChatRequest(tuple(messages), max_tokens=max_tokens, params=SamplingParams(temperature=0.0),
                          conversation="server")
    start, first, last, parts, tokens = time.perf_counter(), None, None, [], 0
    for event in service.submit(request, client="cli").events():
        if isinstance(event, Traced) and event.round.emitted:
            now = time.perf_counter()
            first = first or now
            last = now
            parts.append(event.round.text)
        elif isinstance(event, Finished):
            tokens = event.stats.tokens
    return first - start, (tokens - 1) / (last - first) if last > first else 0.0, "".join(parts)


def _server(client, model, messages, max_tokens):
    """The same, through the HTTP server and the openai client (usage gives the token count)."""
    start, first, last, parts, tokens = time.perf_counter(), None, None, [], 0
    stream = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=max_tokens,
                                            stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        if chunk.choices and chunk.choices[0].delta.content:
            now = time.perf_counter()
            first = first or now
            last = now
            parts.append(chunk.choices[0].delta.content)
    return first - start, (tokens - 1) / (last - first) if last > first else 0.0, "".join(parts)


def _client_loop(url: str) -> None:
    """The server's client, in its own process: one JSON request per stdin line, one result line back."""
    import sys

    import openai

    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
    for line in sys.stdin:
        ask = json.loads(line)
        print(json.dumps(_server(client, ask["model"], ask["messages"], ask["max_tokens"])), flush=True)


class _ClientProcess:
    def __init__(self, url: str):
        import subprocess
        import sys

        self.process = subprocess.Popen([sys.executable, __file__, "--client", url], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)

    def ask(self, model, messages, max_tokens):
        self.process.stdin.write(json.dumps({"model": model, "messages": messages, "max_tokens": max_tokens}) + "\n")
        self.process.stdin.flush()
        return tuple(json.loads(self.process.stdout.readline()))

    def close(self):
        self.process.stdin.close()
        self.process.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo")
    parser.add_argument("--draft", default="auto")
    parser.add_argument("--backend", default=None)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--json", default=None)
    parser.add_argument("--client", default=None, help=argparse.SUPPRESS)  # the child process's role
    args = parser.parse_args()
    if args.client:
        _client_loop(args.client)
        return

    from app.draft_choice import DraftChoice
    from app.server.host import ApiServer
    from app.server.openai_api import model_id
    from app.service import RunnerService

    service = RunnerService()
    draft = DraftChoice.parse_loadable(args.draft)
    loaded = service.load(args.model, args.backend, draft=draft, progress=lambda m: None).result()
    server = ApiServer(service, "127.0.0.1", 0)
    server.start()
    client = _ClientProcess(server.url)
    prompts = json.loads(SUITE.read_text())["prompts"][: args.prompts]
    rows = []
    try:
        _cli(service, [{"role": "user", "content": "Hello"}], 8)  # warm both paths once
        client.ask(model_id(service), [{"role": "user", "content": "Hello"}], 8)
        for prompt in prompts:
            messages = [{"role": "user", "content": prompt["user"]}]
            runs = {"cli": [], "server": []}
            _cli(service, messages, args.max_tokens)  # untimed: every timed run then reuses the same prefix
            for _ in range(args.repeats):
                runs["cli"].append(_cli(service, messages, args.max_tokens))
                runs["server"].append(client.ask(model_id(service), messages, args.max_tokens))
            same = len({r[2] for side in runs.values() for r in side}) == 1
            row = {"prompt": prompt["name"], "identical": same}
            for side, results in runs.items():
                row[f"{side}_tok_s"] = statistics.median(r[1] for r in results)
                row[f"{side}_ttft_s"] = statistics.median(r[0] for r in results)
            row["ratio"] = row["server_tok_s"] / row["cli_tok_s"]
            rows.append(row)
            print(f"{row['prompt']:<24} cli {row['cli_tok_s']:6.1f} tok/s  server {row['server_tok_s']:6.1f} tok/s "
                  f"= {row['ratio']:.3f}x  ttft {row['cli_ttft_s'] * 1000:.0f} / {row['server_ttft_s'] * 1000:.0f} ms"
                  f"  identical: {same}", flush=True)
    finally:
        client.close()
        server.stop()
        service.close()
    ratio = statistics.median(r["ratio"] for r in rows)
    print(f"{loaded.describe()}: server / CLI tokens/s, median of {len(rows)} prompts: {ratio:.3f}x")
    if args.json:
        summary = {"pair": loaded.describe(), "median_ratio": ratio, "rows": rows}
        Path(args.json).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
