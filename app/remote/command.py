"""The command line's side of a remote target: `tandem-cli remote models|key|forget URL`, the
`--remote-model` and `--ca-file` options of generate and bench, a server's address in --model
as Runner.load takes it, and `bench --model URL` (app/bench/remote.py)."""

from __future__ import annotations

import os
import sys

from app.cli_types import named
from app.draft_choice import DraftKind


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def add_parser(sub) -> None:
    remote = sub.add_parser("remote", help="a remote server's models, and its API key (kept in the system's "
                                           "credential store)")
    remote_sub = remote.add_subparsers(dest="remote_command", required=True)
    for name, words in (("models", "the models the server serves"),
                        ("key", "keep the server's API key (typed at a prompt, or one line on stdin)"),
                        ("forget", "forget the server's API key")):
        command = remote_sub.add_parser(name, help=words)
        command.add_argument("address", type=named("a server's address (http(s)://host:port)"))
        if name == "models":
            command.add_argument("--ca-file", type=named("a CA file"), default=None,
                                 help="the PEM file of the CA that signed a self-signed server's certificate")
        command.set_defaults(func=cmd_remote)


def remote_options(parser) -> None:
    parser.add_argument("--remote-model", default=None, metavar="ID",
                        help="with a server's address: which of its models (default: its only one)")
    parser.add_argument("--ca-file", default=None, type=named("a CA file"), metavar="PEM",
                        help="with an https:// address: the CA that signed a self-signed server's certificate")


def target_spec(args):
    """--model as Runner.load takes it: a server's address becomes a RemoteSpec (its key from
    $TANDEM_REMOTE_API_KEY, else the one `tandem-cli remote key` kept), anything else stays."""
    from app.remote.endpoint import RemoteSpec, is_remote

    if not is_remote(args.model):
        if getattr(args, "remote_model", None) or getattr(args, "ca_file", None):
            raise ValueError("--remote-model and --ca-file are for a server's address in --model (http://...).")
        return args.model
    if args.draft.kind not in (DraftKind.AUTO, DraftKind.NONE):
        raise ValueError(f"A remote target drafts on its server, as the server was started: --draft {args.draft} "
                         "would load a draft here. Leave --draft out.")
    from app.remote.keys import KEY_VARIABLE

    return RemoteSpec(args.model, args.remote_model, args.ca_file, os.environ.get(KEY_VARIABLE) or None)


def cmd_remote(args) -> int:
    """A remote server's models, and the key kept for it (app/remote/keys.py)."""
    import getpass

    from app.remote import keys
    from app.remote.endpoint import parse_endpoint

    endpoint = parse_endpoint(args.address)
    if args.remote_command == "key":
        key = (getpass.getpass(f"API key for {endpoint.origin}: ") if sys.stdin.isatty()
               else sys.stdin.readline()).strip()
        if not key:
            raise ValueError("No key was given: type it at the prompt, or pipe it in on one line.")
        keys.save(endpoint.origin, key)
        _say(f"The key for {endpoint.origin} is kept {keys.where()}.")
        return 0
    if args.remote_command == "forget":
        found = keys.forget(endpoint.origin)
        _say(f"The key for {endpoint.origin} was forgotten." if found else f"No key was kept for {endpoint.origin}.")
        return 0
    from app.remote.client import RemoteClient
    from app.remote.target import engine_name

    client = RemoteClient(endpoint, os.environ.get(keys.KEY_VARIABLE) or keys.load(endpoint.origin), args.ca_file)
    try:
        models = client.models()
    finally:
        client.close()
    for model in models:
        context = f"\t{model.max_model_len} tokens" if model.max_model_len else "\t"
        print(f"{model.id}\t{engine_name(model.owned_by)}{context}")
    if not models:
        _say(f"{endpoint.base}/models lists no models.")
    return 0


def bench_remote(args, runner, spec, prompts, params, progress=_say) -> int:
    """The suite against a server's model (app/bench/remote.py): the rows that apply, and what was left out."""
    import json

    from app.bench.remote import format_remote, remote_summary, run_remote_bench

    loaded = runner.load(spec, progress=progress)
    progress(f"Loaded {loaded.describe()} in {loaded.load_s:.1f}s")
    rows, skipped, wall_s = run_remote_bench(runner, prompts, params, args.repeats,
                                             progress=progress if args.verbose else (lambda message: None))
    header = (f"target {loaded.remote_model} on {loaded.dtype} at {loaded.remote} · T={args.temperature} · "
              f"{len(prompts)} prompts · {args.repeats} repeats")
    print(format_remote(rows, skipped, header, wall_s))
    if args.json:
        config = {"target": args.model, "model": loaded.remote_model, "engine": loaded.dtype,
                  "temperature": args.temperature, "repeats": args.repeats, "prompts": len(prompts),
                  "command": "tandem-cli " + " ".join(sys.argv[1:])}
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(remote_summary(rows, skipped, config, wall_s), out, indent=1)
        progress(f"wrote {args.json}")
    runner.remote.close()
    return 0
