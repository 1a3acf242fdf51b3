"""The HA lab: N PostgreSQL instances run by Patroni, with one etcd as the DCS, all on this host (``HALab``, in
lab.py, where the lab's layout and timings are described).

Split along its seams: a core every part is given, and the parts ``HALab`` holds (``lab.dcs``, ``lab.patroni``,
``lab.faults``, ``lab.settings``), the lower ones knowing nothing of the higher:

    node.py         the nodes and their daemons
    config.py       what Patroni is told: timings (checked), DCS configuration, each node's patroni.yml
    membership.py   the core: the lab's state, and the cluster as Patroni's REST API reports it (members, the
                    leader, waiting until ready)
    processes.py    the parts ``Etcd`` and ``Patronis``: found, started (Patroni in a node's cgroup), adopted, stopped
    faults.py       the part ``Faults``: switchover, kills, the new leader, a node started again
    settings.py     the part ``Settings``: parameters through Patroni's dynamic configuration, restarts they need,
                    rolling restarts, a departed member's slot
    restore.py      a backup staged for the first node's bootstrap
    lab.py          ``HALab``: builds, attaches, adds and removes nodes, stops (teardown is the base's)
"""

from pglab.targets.local.ha.config import TIMINGS, check_timings
from pglab.targets.local.ha.faults import Kill
from pglab.targets.local.ha.lab import HALab, clean_ha_lab
from pglab.targets.local.leftovers import is_ha_lab  # also imported from here by cli.py and cluster_cli.py

__all__ = ["TIMINGS", "HALab", "Kill", "check_timings", "clean_ha_lab", "is_ha_lab"]
