"""While a gke run's jobs run, its pods are read every few seconds and each one the run loses (a preempted or
repaired host: its pod deleted, and KubeRay makes another) is kept as it goes, its log and last events
(``components.platforms.postmortem.LostPods``): by teardown the lost pod is gone, and with it what it said.

One keeper per run in a process, a daemon thread started with the run's first job client and stopped by teardown
before it deletes anything (the pods it deletes are not lost ones). A read that fails is retried at the next tick:
the keeper never fails the run."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from components.platforms import RunContext, postmortem

if TYPE_CHECKING:
    from collections.abc import Callable

    from components.platforms.gke.cloud.kube import Kube

INTERVAL_S = 10.0  # the pods are read this often; a replaced pod is terminating for longer (its grace period)


class Keeper:
    def __init__(
        self,
        ctx: RunContext,
        kube: Kube,
        selector: str,
        interval_s: float = INTERVAL_S,
        log: Callable[[str], None] = print,
    ) -> None:
        self.lost = postmortem.LostPods(ctx.store, kube)
        self.kube, self.selector, self.interval_s, self.log = kube, selector, interval_s, log
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lost-pods-{ctx.run_id}", daemon=True)

    def start(self) -> Keeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                before = len(self.lost.kept)
                self.lost.observe(self.kube.pods(self.selector))
                for kept in self.lost.kept[before:]:
                    self.log(f"pod {kept['name']} {kept['why']}: kept its log and events ({kept['log']})")
            except Exception as exc:  # noqa: BLE001 - the post-mortem never fails the run; tried again next tick
                self.log(f"lost pods: could not read the pods ({type(exc).__name__}: {str(exc)[:200]})")
            self._stop.wait(self.interval_s)
