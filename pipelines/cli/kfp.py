"""The command line's Kubeflow Pipelines flags: where the API server is and how to reach it (``--kfp-host`` and the
rest), on ``tpupipe submit``, ``schedule``, ``runs`` and ``publish``; given ``--kfp-host``, those commands work through
the KFP backend (``pipelines.backends``)."""

from __future__ import annotations

import argparse

from pipelines.backends import KFP_AUTHS, KFP_MULTI_USER_RUNNER, KFP_RUNNER, KfpPlace


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The KFP place's options, on every command that reaches Kubeflow Pipelines."""
    p.add_argument(
        "--kfp-host",
        default="",
        help="the Kubeflow Pipelines API server (http://localhost:8888 through a port-forward, or the deployment's "
        "URL): the run goes to open-source Kubeflow Pipelines there instead of Vertex AI (docs/kubeflow.md)",
    )
    p.add_argument("--kfp-namespace", default="kubeflow", help="with --kfp-host: the runs' namespace (kubeflow)")
    p.add_argument(
        "--kfp-auth",
        choices=KFP_AUTHS,
        default="none",
        help="with --kfp-host: none (a port-forward to a single-user server), sa-token (the pod's projected KFP token, "
        "in-cluster), token (a Kubernetes token for the audience pipelines.kubeflow.org, from --kfp-token-file: a "
        "multi-user server from outside the cluster), iap (a Google ID token for an endpoint behind "
        "Identity-Aware Proxy, with --kfp-iap-client-id) or userid (--kfp-user's e-mail in the kubeflow-userid "
        "header of every request, which a multi-user server takes at its word: whoever can send it to the API "
        "server is any user, so it goes only to localhost, a `kubectl port-forward` to the API server, unless "
        "--kfp-trust-user-header; the server must read kubeflow-userid with no prefix, as Kubeflow's multi-user "
        "install sets it; token is the recommended way: docs/kubeflow.md)",
    )
    p.add_argument(
        "--kfp-user",
        default="",
        help="with --kfp-auth userid: the e-mail of the Kubeflow user the requests are made as (a profile's owner or "
        "contributor in --kfp-namespace)",
    )
    p.add_argument(
        "--kfp-trust-user-header",
        action="store_true",
        help="with --kfp-auth userid: send the user id header to a --kfp-host that is not this machine, because you "
        "trust every network path to it (nothing but you, or Kubeflow's own services, can reach its API server "
        "with the header); refused without it, since whoever can send the header is any user (docs/kubeflow.md)",
    )
    p.add_argument(
        "--kfp-token-file",
        default="",
        help="with --kfp-auth token: the file holding the bearer token (`kubectl create token default-editor -n "
        "NAMESPACE --audience pipelines.kubeflow.org`), readable by you alone (mode 600); the runs go to "
        "--kfp-namespace, which that identity must be allowed in",
    )
    p.add_argument("--kfp-iap-client-id", default="", help="the OAuth client id of the endpoint's IAP (--kfp-auth iap)")
    p.add_argument(
        "--insecure",
        action="store_true",
        help="with --kfp-host http://… and --kfp-auth sa-token, token, iap or userid: send the token (or the user id "
        "header) over plain HTTP to a host that is not this machine (refused without it; localhost needs no flag)",
    )
    p.add_argument(
        "--kfp-service-account",
        default="",
        help="with --kfp-host: the Google service account the runner's Kubernetes service account acts as by Workload "
        "Identity; checked, not set, before the run is created: its Workload Identity binding to the runner in "
        '--kfp-namespace and its roles (docs/kubeflow.md, "Setup, once")',
    )
    p.add_argument(
        "--kfp-runner",
        default="",
        help="with --kfp-service-account: the Kubernetes service account the run's pods run as, whose binding is "
        f"checked (default: --service-account when given, else the server's default runner: {KFP_MULTI_USER_RUNNER}, "
        f"the profile's, on a multi-user server; {KFP_RUNNER} on a single-user one)",
    )


def place_of(args: argparse.Namespace) -> KfpPlace:
    """The KFP place the flags name; the backend checks it before any call (``KfpBackend``, ``jobs.client``)."""
    return KfpPlace(
        args.kfp_host,
        args.kfp_namespace,
        args.kfp_auth,
        args.kfp_iap_client_id,
        insecure=args.insecure,
        token_file=args.kfp_token_file,
        user=args.kfp_user,
        trust_user_header=args.kfp_trust_user_header,
    )
