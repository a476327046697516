"""The `tidalmq operator` sub-command (registered through the tidalmq.commands entry point)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("operator", help="the Kubernetes operator (Kopf)")
    op_sub = p.add_subparsers(dest="operator_command", metavar="ACTION", required=True)
    run = op_sub.add_parser(
        "run",
        help="run the operator: the controller, Topic/PartitionReassignment/StaticTopic handlers",
        description="Settings come from TIDALMQ_* environment variables (see the Helm chart).",
    )
    run.add_argument("--namespace", help="namespace to manage (env TIDALMQ_OPERATOR_NAMESPACE)")
    run.set_defaults(handler=_run)
    uninstall = op_sub.add_parser(
        "uninstall",
        help="stop the operator and remove its finalizers (the Helm chart's pre-delete hook)",
        description="Scale the operator's Deployment to 0, wait for its pods to go, then remove "
        "the operator's finalizer from every Topic, StaticTopic, PartitionReassignment and "
        "ClusterState of the namespace, so that it can be deleted without the operator. Deletes "
        "no resource and no data.",
    )
    uninstall.add_argument(
        "--namespace", help="the release namespace (env TIDALMQ_OPERATOR_NAMESPACE)"
    )
    uninstall.add_argument(
        "--operator-deployment", required=True, help="name of the operator's Deployment"
    )
    uninstall.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to wait for the operator to stop"
    )
    uninstall.set_defaults(handler=_uninstall)


def _run(args: argparse.Namespace) -> int:
    import dataclasses

    from tidalmq_operator.main import main
    from tidalmq_operator.settings import OperatorSettings

    settings = OperatorSettings.from_env()
    if args.namespace:
        settings = dataclasses.replace(settings, namespace=args.namespace)
    return main(settings)


def _uninstall(args: argparse.Namespace) -> int:
    import logging
    import os
    import sys

    from tidalmq_operator.uninstall import run

    namespace = args.namespace or os.environ.get("TIDALMQ_OPERATOR_NAMESPACE")
    if not namespace:
        print("--namespace (or TIDALMQ_OPERATOR_NAMESPACE) is required", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    outcome = run(namespace, args.operator_deployment, args.timeout)
    print(
        f"operator {'stopped' if outcome.operator_stopped else 'NOT stopped'}; finalizer removed "
        f"from {len(outcome.released)} resources; {len(outcome.failed)} failed"
    )
    return 0 if outcome.ok else 1
