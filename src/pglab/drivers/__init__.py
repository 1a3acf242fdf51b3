"""One driver per target, and the factory that chooses it from the plan (``plan.target``, ``plan.tenants``).

A driver does what only its target can (bring the topology up, one measured run, clean up); the sweep around it
is ``pglab.engine``'s. Adding a target is adding a module here and a branch in :func:`driver_for`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pglab.engine.driver import Driver
from pglab.engine.types import Observer
from pglab.errors import UserError
from pglab.plan.schema import Plan


def check_options(plan: Plan, *, keep: bool = False, allow_destructive: bool = False) -> None:
    """Refuse the ``pglab run`` options the plan's target cannot honour, in one sentence each."""
    if plan.target.kubernetes is not None:
        if keep:
            raise UserError("--keep: a Kubernetes sweep always deletes what it created; run without --keep (and "
                            "'pglab k8s render' for manifests to apply by hand).")
        if allow_destructive:
            raise UserError("--allow-destructive: only an external target needs it; the Kubernetes Cluster is "
                            "pglab's own.")
    elif allow_destructive and plan.target.external is None:
        raise UserError("--allow-destructive: only an external target needs it; the local lab is pglab's own.")


def driver_for(plan: Plan, plan_text: str, plan_dir: Path, results_dir: Path, ui: Observer, *,
               allow_destructive: bool = False, **kubernetes: Any) -> Driver:
    """The driver of the plan's target; ``kubernetes`` are the Kubernetes driver's options (an API client, its
    polling and timeouts), for tests and the CLI's preflight."""
    check_options(plan, allow_destructive=allow_destructive)
    if plan.target.kubernetes is not None and plan.tenants is not None:
        from pglab.drivers.kubernetes_tenants import KubernetesTenantsDriver

        return KubernetesTenantsDriver(plan, plan_text, plan_dir, results_dir, ui, **kubernetes)
    if plan.target.kubernetes is not None:
        from pglab.drivers.kubernetes import KubernetesDriver

        return KubernetesDriver(plan, plan_text, plan_dir, results_dir, ui, **kubernetes)
    from pglab.drivers.local import LocalDriver

    if plan.target.external is not None:
        from pglab.targets.external import ExternalServer

        return LocalDriver(plan, plan_dir, plan_text, results_dir,
                           ExternalServer(plan.target.external, plan, allow_destructive), ui)
    local = plan.target.local
    assert local is not None
    if plan.tenants is not None:
        from pglab.drivers.tenants import TenantsDriver
        from pglab.targets.local.fleet import Fleet

        return TenantsDriver(plan, plan_dir, plan_text, results_dir, Fleet(plan, plan_dir, log=ui.log), ui)
    if local.ha == "patroni":
        from pglab.targets.local.ha_target import PatroniTarget

        return LocalDriver(plan, plan_dir, plan_text, results_dir, PatroniTarget(local, plan_dir, log=ui.log), ui)
    from pglab.targets.local.cluster import LocalLab

    # the lab loads the dataset on its primary alone and snapshots it while it builds
    return LocalDriver(plan, plan_dir, plan_text, results_dir,
                       LocalLab(local, plan_dir, log=ui.log, dataset=plan.dataset), ui)
