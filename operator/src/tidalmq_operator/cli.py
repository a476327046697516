"""The `tidalmq operator` sub-command (registered through the tidalmq.commands entry point)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("operator", help="the Kubernetes operator (Kopf)")
    op_sub = p.add_subparsers(dest="operator_command", metavar="ACTION", required=True)
    run = op_sub.add_parser(
        "run",
        help="run the operator: the controller, Topic/PartitionReassignment/StaticTopic handlers",
        description="Settings come from TIDALMQ_* environment variables (see the Helm chart).",
    )
    run.add_argument("--namespace", help="namespace to manage (env TIDALMQ_OPERATOR_NAMESPACE)")
    run.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    import dataclasses

    from tidalmq_operator.main import main
    from tidalmq_operator.settings import OperatorSettings

    settings = OperatorSettings.from_env()
    if args.namespace:
        settings = dataclasses.replace(settings, namespace=args.namespace)
    return main(settings)
