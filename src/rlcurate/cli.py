"""The ``rlcurate`` command line.

    rlcurate train --config configs/NAME.yaml [--set key=value ...]   GRPO with a curation strategy (ch. 5)
    rlcurate audit ...                                                 the variance audit (ch. 4)
    rlcurate warmstart ...                                             supervised warm-start of the tiny model (ch. 4)
    rlcurate serve ...                                                 an OpenAI-compatible server for a checkpoint
    rlcurate runs --suite configs/suites/NAME.yaml                     reference runs committed as JSON (ch. 5-10)
    rlcurate strategies                                                list the curation strategies

Each sub-command's ``--help`` lists its options.
"""

from __future__ import annotations

import argparse
import json
import sys


def _train(argv: list[str]) -> int:
    from rlcurate.train.config import TrainConfig, field_docs

    docs = field_docs()
    parser = argparse.ArgumentParser(
        prog="rlcurate train", description="GRPO training with a pluggable curation strategy (chapter 5).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="config keys (set in the YAML file or with --set key=value):\n" + "\n".join(
            f"  {k}: {v}" for k, v in docs.items()))
    parser.add_argument("--config", help="YAML file with config keys (defaults for the rest)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a key; values are parsed as YAML (repeatable)")
    args = parser.parse_args(argv)
    try:
        if args.config:
            config = TrainConfig.load(args.config, args.overrides)
        else:
            from rlcurate.train.config import apply_overrides

            config = TrainConfig.from_dict(apply_overrides({}, args.overrides), source="--set")
    except ValueError as exc:
        parser.error(str(exc))
    from rlcurate.train import Trainer

    summary = Trainer(config).run()
    print(json.dumps({"out_dir": config.out_dir, "first_eval": summary["first_eval"],
                      "final_eval": summary["final_eval"]}, indent=2))
    return 0


def _strategies(argv: list[str]) -> int:
    from rlcurate.curation import available
    from rlcurate.curation.registry import _REGISTRY

    for name in available():
        doc = (_REGISTRY[name].__doc__ or "").strip().splitlines()[0]
        print(f"{name:22s} {doc}")
    return 0


def _delegate(module: str):
    def run(argv: list[str]) -> int:
        import importlib

        return int(importlib.import_module(module).main(argv) or 0)
    return run


COMMANDS = {
    "train": _train,
    "audit": _delegate("rlcurate.audit.cli"),
    "warmstart": _delegate("rlcurate.models.warmstart"),
    "serve": _delegate("rlcurate.rollout.server"),
    "runs": _delegate("rlcurate.experiments"),
    "strategies": _strategies,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"rlcurate: unknown command {cmd!r}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    return COMMANDS[cmd](rest)


if __name__ == "__main__":
    raise SystemExit(main())
