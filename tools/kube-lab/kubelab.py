#!/usr/bin/env python3
"""A real multi-node Kubernetes with the CloudNativePG operator, started as plain processes from what
tools/kube-lab/build.sh built: etcd and the control plane once, then per node a network namespace, containerd,
kubelet, kube-proxy and a volume provisioner on a disk of its own; CoreDNS and the operator on top. pglab's
Kubernetes tests run against it, and so can a user:

    sudo .venv/bin/python tools/kube-lab/kubelab.py up            # 5 nodes; prints the kubeconfig to use
    sudo .venv/bin/python tools/kube-lab/kubelab.py node stop lab-db-1   # the node dies as a machine does
    sudo .venv/bin/python tools/kube-lab/kubelab.py node start lab-db-1
    sudo .venv/bin/python tools/kube-lab/kubelab.py objectstore   # the S3 store and the Barman Cloud plugin
    sudo .venv/bin/python tools/kube-lab/kubelab.py down

Why it is built this way:
- The studies' placement: with N > 1 nodes, up to 3 database nodes (label pglab.io/role=database) and the rest
  client nodes (pglab.io/role=client; the first also runs CoreDNS and the operator), each in its own zone
  (topology.kubernetes.io/zone): 5 nodes are 3 database nodes and 2 client nodes, so a run's load pods can be
  spread over client nodes. One node (--nodes 1) does everything, for a machine too small for more.
- A node is as separate as one kernel allows: its own network namespace (its address on the lab's bridge, its
  own ports, iptables and pod subnet 10.244.i.0/24, routed from the host and every other node), its own cgroup
  (every process of the node, pods included, under /<hierarchy>/pglab-kube-lab/<node>: losing the node is
  killing that cgroup), and its own disk: a loop device over a sparse file with its own file system (ext4 and
  XFS in turn), where its provisioner makes the volumes of the pods scheduled to it (WaitForFirstConsumer).
- Two storage classes that differ for real: lab-local on that disk, and lab-throttled on a second disk of each
  node (a loop device of its own) whose requests and bytes a cgroup v1 blkio throttle limits (THROTTLE), with a
  provisioner per class on each node.
- No network leaves the machine. The API server listens only on the bridge's address (10.245.0.1); a FORWARD
  rule drops whatever the nodes and pods send anywhere but to each other and to this machine; CoreDNS answers
  only for the cluster's names (no upstream).
- One lab per machine (fixed addresses, one bridge). Its owner (pid and process start time) is recorded in the
  pglab state folder; a lab whose owner died (a killed test run) is stopped and removed by the next start, or by
  ``kubelab.py clean``. Whoever starts a lab stops it, also on Ctrl-C and failure (``with KubeLab(...)``).
- The machines this runs on have cgroup v1 and no systemd: Kubernetes 1.34 (the last that runs on cgroup v1,
  with failCgroupV1: false), cgroupfs drivers; root there lacks CAP_SYS_RESOURCE, so containerd is told not to
  set negative OOM scores (restrict_oom_score_adj).
Standard library only: it runs before anything of pglab is needed, as root.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

LINK = "pglabkube0"              # the lab's bridge: the control plane's address, each node's veth a port of it
API_IP = "10.245.0.1"            # the API server's (and the control plane's) only address, on that bridge
LAB_NET = "10.245.0.0/24"        # the nodes' addresses: API_IP's network, node i at .(10 + i)
POD_CIDR = "10.244.0.0/16"       # node i's pods: 10.244.i.0/24
SERVICE_CIDR = "10.96.0.0/16"
API_SERVICE_IP = "10.96.0.1"
DNS_IP = "10.96.0.10"
STORAGE_CLASS = "lab-local"
THROTTLED_CLASS = "lab-throttled"  # the slow class: each node's second disk, limited by THROTTLE
# The second disk's limits (cgroup v1 blkio throttle, per direction, on its loop device): 100 requests and 8 MiB a
# second, a small cloud disk's figures. cgroup v1 throttles only the I/O of the tasks in the cgroup that carries the
# rule (not its children), so a node's throttle daemon writes it into every cgroup of the node as it appears (the
# kubelet's pods, runc's containers) and into the root cgroup (the kernel's threads: journal commits, writeback).
THROTTLE = {"read_iops_device": 100, "write_iops_device": 100, "read_bps_device": 8 << 20,
            "write_bps_device": 8 << 20}
THROTTLE_POLL_S = 0.1
HOUSEKEEPING_S = 2              # cAdvisor's (the kubelet's) container stats interval
START_TIMEOUT_S = 240           # each component; the first start of a slow, busy machine took ~40 s in all
NODE_MONITOR_GRACE_S = 20       # a node that stops reporting is NotReady after this (Kubernetes' default: 40-50 s)
DEFAULT_NODES = 5               # 3 database nodes and 2 client nodes: the studies' placement, load over 2 nodes
DATABASE_NODES = 3              # at most: one per instance of a 3-instance Cluster, the rest are client nodes
DISK_BYTES = 8 << 30            # each node's disk: a sparse file on a loop device
SLOW_DISK_BYTES = 4 << 30       # each node's second disk (THROTTLED_CLASS), likewise
DISKS = {STORAGE_CLASS: "disk", THROTTLED_CLASS: "slow"}  # class -> the node's image <name>.img, mounted at <name>/
CGROUP = "pglab-kube-lab"       # every node's processes (its daemons, shims and pods) under /<hierarchy>/CGROUP/<node>
CP_STOP_ORDER = ("kube-scheduler", "kube-controller-manager", "kube-apiserver")
# the order a node's daemons are stopped in (started in reverse: the throttle before the kubelet's first pod)
NODE_DAEMONS = ("provisioner", "provisioner-throttled", "kube-proxy", "kubelet", "throttle", "containerd")
# the lab's keys: P-256, which every component takes (the CA, the serving and client certificates, the service
# account signing key); an RSA 2048 key took openssl 0.2 s to make, and a lab makes 12
EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256")
ROLE_LABEL = "pglab.io/role"
SYSTEM_LABEL = "lab.pglab/system"  # the node CoreDNS and the operator are kept on (tools/kube-lab/manifests)


class LabError(RuntimeError):
    """The lab cannot start or stop; the message says what and why in one sentence."""


def cache_dir() -> Path:
    """The lab cache build.sh wrote: under sudo, the invoking user's (./setup.sh kube-lab ran as that user)."""
    home = Path(pwd.getpwnam(os.environ["SUDO_USER"]).pw_dir) if os.environ.get("SUDO_USER") else Path.home()
    base = os.environ.get("XDG_CACHE_HOME") or str(home / ".cache")
    return Path(os.environ.get("PGLAB_KUBE_LAB_CACHE") or Path(base) / "pglab" / "kube-lab")


def state_file() -> Path:
    """Where the running lab is recorded: the pglab state folder, as pglab's own local labs."""
    if os.environ.get("PGLAB_STATE_DIR"):
        base = Path(os.environ["PGLAB_STATE_DIR"])
    else:
        base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "pglab"
    base.mkdir(parents=True, exist_ok=True)
    return base / "kube-lab.json"


def newest_build(prefix: str, missing: str, having: str = ".complete") -> Path:
    """The newest complete build ``<prefix>-<key>`` in the lab cache holding the file ``having``; ``missing``: what
    to run when there is none."""
    builds = sorted((p for p in cache_dir().glob(f"{prefix}-*")
                     if (p / ".complete").exists() and (p / having).exists()),
                    key=lambda p: (p / ".complete").stat().st_mtime)
    if not builds:
        raise LabError(f"no {prefix} build in {cache_dir()}: run {missing}, which builds it")
    return builds[-1]


def newest_images() -> Path:
    """The images folder of the newest complete build in the cache (build.sh prints the one it made)."""
    return newest_build("images", "./setup.sh test (or ./setup.sh kube-lab)")


def start_time(pid: int) -> int | None:
    """When a live process started (clock ticks since boot), or None: gone, or a zombie (a killed node's daemon that
    its parent, the lab's owner, has not reaped)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return None if fields[0] == "Z" else int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def run(*cmd: str | Path, check: bool = True, timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, check=False, **kw)
    if check and proc.returncode != 0:
        raise LabError(f"{' '.join(str(c) for c in cmd[:3])} failed: {(proc.stderr or proc.stdout).strip()[-400:]}")
    return proc


@dataclass(frozen=True)
class Node:
    """One node of the lab: its own network namespace (a veth on the lab's bridge), containerd, kubelet, kube-proxy
    and volume provisioner, its own pod subnet, cgroup and disk (a loop device with a file system of its own)."""

    index: int                  # 1-based
    name: str
    role: str | None            # "database", "client", or None on a single node (it is both)
    fstype: str                 # its disk's file system
    system: bool                # CoreDNS and the operator run here

    @property
    def ip(self) -> str:
        return f"10.245.0.{10 + self.index}"

    @property
    def subnet(self) -> str:
        return f"10.244.{self.index}.0/24"

    @property
    def netns(self) -> str:
        return f"pglab-kl-{self.index}"

    @property
    def veth(self) -> str:
        return f"pglabkl{self.index}"  # the host's end; the node's end is its eth0

    @property
    def zone(self) -> str:
        return f"lab-{chr(ord('a') + self.index - 1)}"

    @property
    def labels(self) -> dict[str, str]:
        labels = {"topology.kubernetes.io/region": "lab", "topology.kubernetes.io/zone": self.zone}
        if self.role:
            labels[ROLE_LABEL] = self.role
        if self.system:
            labels[SYSTEM_LABEL] = "true"
        return labels


def lab_nodes(count: int) -> list[Node]:
    """One node does everything; more: up to DATABASE_NODES database nodes (their disks ext4 and XFS in turn), the
    rest client nodes, the first of which also runs the system pods."""
    if count < 1 or count > 9:
        raise LabError(f"--nodes {count}: the lab runs 1 to 9 nodes")
    if count == 1:
        return [Node(1, "lab-node-1", None, "ext4", True)]
    databases = min(DATABASE_NODES, count - 1)
    return [Node(i, f"lab-db-{i}", "database", ("ext4", "xfs")[(i - 1) % 2], False)
            for i in range(1, databases + 1)] + [
        Node(i, f"lab-client-{i - databases}", "client", "ext4", i == databases + 1)
        for i in range(databases + 1, count + 1)]


class KubeLab:
    """One lab: ``start()`` brings a ready cluster (every node Ready, CoreDNS and the operator rolled out),
    ``stop()`` removes every process, mount, network namespace and device, loop device, cgroup and rule it made.
    ``with KubeLab(...) as lab`` does both."""

    def __init__(self, images: Path | None = None, root: Path | None = None, nodes: int | None = None) -> None:
        self.images = images or newest_images()
        self.bin = self.images.parent / ("bin-" + self.images.name.split("-", 1)[1][8:])
        self.provisioner = self.bin / f"provisioner-{provisioner_key()}" / "hostpath-provisioner"
        self.root = root or Path(tempfile.mkdtemp(prefix="pglab-kube-lab-"))
        self.root.chmod(0o755)
        self.kubeconfig = self.root / "admin.kubeconfig"
        self.image_names: dict[str, str] = json.loads((self.images / "images.json").read_text())
        self.nodes = lab_nodes(nodes or int(os.environ.get("PGLAB_KUBE_LAB_NODES") or DEFAULT_NODES))
        self.timings: dict[str, float] = {}

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> KubeLab:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if os.geteuid() != 0:
            raise LabError("the Kubernetes lab needs root (it starts containerd, kubelets and network devices); "
                           "run the tests as root or with sudo")
        if not Path("/sys/fs/cgroup/cpu").exists():
            raise LabError("no cgroup v1 hierarchy at /sys/fs/cgroup/cpu: the lab's kubelets need cgroup v1")
        tools = ["containerd", "runc", "ctr", "iptables", "openssl", "ip", "nsenter", "losetup", "mkfs.ext4"]
        if not (Path("/sys/fs/cgroup/blkio") / "blkio.throttle.write_iops_device").exists():
            raise LabError("no cgroup v1 blkio throttle at /sys/fs/cgroup/blkio: the lab's class lab-throttled needs "
                           "it")
        tools += ["mkfs.xfs"] if any(n.fstype == "xfs" for n in self.nodes) else []
        for tool in tools:
            if shutil.which(tool) is None:
                raise LabError(f"{tool} is not installed: run ./setup.sh test, which installs the lab's packages")
        if not (self.bin / "kubelet").exists():
            raise LabError(f"the lab's binaries are missing beside {self.images}: run ./setup.sh test to build them")
        if not self.provisioner.exists():
            raise LabError(f"the volume provisioner of this checkout is not built ({self.provisioner}): run "
                           "./setup.sh test (or tools/kube-lab/build.sh GO), which builds it in seconds")
        clean_orphan()
        t0 = time.monotonic()
        self._claim()
        (self.root / "lab.json").write_text(json.dumps({
            "bin": str(self.bin), "images": str(self.images), "nodes": [asdict(n) for n in self.nodes]}))
        self._pki()
        self._network()
        self._control_plane()
        for node in self.nodes:
            self._prepare_node(node)
        self._import_images()
        for node in self.nodes:
            start_node(self.root, node.name)
        self.timings["start_s"] = time.monotonic() - t0
        self._wait(f"{self.nodes[0].name}/kubelet", "registered and Ready on every node", self._nodes_ready)
        self._addons()
        self.timings["ready_s"] = time.monotonic() - t0

    def stop(self) -> None:
        """Stops what this lab started; safe to call twice and on a half-started lab."""
        stop_lab(self.root)
        with contextlib.suppress(OSError, ValueError):
            if json.loads(state_file().read_text()).get("root") == str(self.root):
                state_file().unlink()
        shutil.rmtree(self.root, ignore_errors=True)

    def kubectl(self, *args: str | Path, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return run(self.bin / "kubectl", "--kubeconfig", self.kubeconfig, *args, check=check, timeout=timeout)

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise LabError(f"no node {name} in this lab (its nodes: {', '.join(n.name for n in self.nodes)})")

    def node_disk(self, name: str, storage_class: str = STORAGE_CLASS) -> Path:
        """Where a node's volumes of a class are: the mount of its disk for that class."""
        return node_root(self.root, name) / DISKS[storage_class]

    def node_device(self, name: str, storage_class: str = STORAGE_CLASS) -> str:
        """The kernel's name of a node's disk for a class (its loop device, as /proc/diskstats names it)."""
        image = node_root(self.root, self.node(name).name) / f"{DISKS[storage_class]}.img"
        found = run("losetup", "-j", image).stdout.split(":", 1)[0]
        if not found.startswith("/dev/"):
            raise LabError(f"node {name} has no disk attached for {storage_class}")
        return found.removeprefix("/dev/")

    def stop_node(self, name: str) -> None:
        stop_node(self.root, self.node(name).name)

    def objectstore(self, build: Path | None = None) -> dict[str, float]:
        """Starts the object store and the Barman Cloud plugin in this lab (``start_objectstore``)."""
        return start_objectstore(self.root, build)

    def start_node(self, name: str) -> None:
        start_node(self.root, self.node(name).name)

    # ------------------------------------------------------------------ steps
    def _claim(self) -> None:
        state = state_file()
        with contextlib.suppress(OSError, ValueError):
            other = json.loads(state.read_text())
            if other.get("kept") and _running(Path(other["root"])):
                raise LabError(f"the Kubernetes lab started by 'kubelab.py up' is running ({other['root']}); one "
                               "runs at a time: stop it with kubelab.py down")
            if not other.get("kept") and start_time(other["pid"]) == other["pid_start"]:
                raise LabError(f"a Kubernetes lab is already running here (owned by pid {other['pid']}, in "
                               f"{other['root']}); one runs at a time: wait for it, or stop its owner")
        pid = os.getpid()
        state.write_text(json.dumps({"root": str(self.root), "pid": pid, "pid_start": start_time(pid),
                                     "started": time.time()}))

    def _pki(self) -> None:
        pki = self.root / "pki"
        pki.mkdir(parents=True)
        ssl = ("openssl",)
        run(*ssl, "req", "-x509", *EC_KEY, "-nodes", "-keyout", pki / "ca.key", "-out", pki / "ca.crt",
            "-days", "30", "-subj", "/CN=pglab-kube-lab-ca")
        certs = {  # name: (CN, O, SANs)
            "apiserver": ("kube-apiserver", "", f"DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,"
                          f"DNS:kubernetes.default.svc.cluster.local,IP:{API_SERVICE_IP},IP:{API_IP},IP:127.0.0.1"),
            "admin": ("kubernetes-admin", "system:masters", ""),
            "apiserver-kubelet-client": ("kube-apiserver-kubelet-client", "system:masters", ""),
            "controller-manager": ("system:kube-controller-manager", "", ""),
            "scheduler": ("system:kube-scheduler", "", ""),
            "kube-proxy": ("system:kube-proxy", "", ""),
        } | {f"kubelet-{n.name}": (f"system:node:{n.name}", "system:nodes", f"DNS:{n.name},IP:{n.ip}")
             for n in self.nodes}
        for name, (cn, org, sans) in certs.items():
            ext = pki / f"{name}.ext"
            ext.write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                           "extendedKeyUsage=clientAuth,serverAuth\n" + (f"subjectAltName={sans}\n" if sans else ""))
            run(*ssl, "req", *EC_KEY, "-nodes", "-keyout", pki / f"{name}.key", "-out",
                pki / f"{name}.csr", "-subj", f"/CN={cn}" + (f"/O={org}" if org else ""))
            run(*ssl, "x509", "-req", "-in", pki / f"{name}.csr", "-CA", pki / "ca.crt", "-CAkey", pki / "ca.key",
                "-CAcreateserial", "-out", pki / f"{name}.crt", "-days", "30", "-extfile", ext)
        run(*ssl, "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", pki / "sa.key")
        run(*ssl, "pkey", "-in", pki / "sa.key", "-pubout", "-out", pki / "sa.pub")
        for name, (user, _, _) in certs.items():
            if name in ("apiserver", "apiserver-kubelet-client"):
                continue
            (self.root / f"{name}.kubeconfig").write_text(json.dumps({
                "apiVersion": "v1", "kind": "Config", "current-context": "pglab-kube-lab",
                "clusters": [{"name": "pglab-kube-lab", "cluster": {
                    "certificate-authority": str(pki / "ca.crt"), "server": f"https://{API_IP}:6443"}}],
                "users": [{"name": user, "user": {"client-certificate": str(pki / f"{name}.crt"),
                                                  "client-key": str(pki / f"{name}.key")}}],
                "contexts": [{"name": "pglab-kube-lab", "context": {"cluster": "pglab-kube-lab", "user": user}}],
            }, indent=1))

    def _network(self) -> None:
        """The lab's bridge (the control plane's address, a port per node), a network namespace per node with its
        veth on the bridge, and routes: each node's pod subnet through that node, from the host and every other
        node. Nothing the lab's namespaces send is forwarded anywhere but between them and to this machine."""
        run("ip", "link", "add", LINK, "type", "bridge")
        run("ip", "addr", "add", f"{API_IP}/24", "dev", LINK)
        run("ip", "link", "set", LINK, "up")
        if shutil.which("modprobe"):
            run("modprobe", "br_netfilter", check=False)
        run("sysctl", "-qw", "net.ipv4.ip_forward=1", check=False)
        for rule in (("-i", LINK, "-o", LINK, "-j", "ACCEPT"), ("-s", POD_CIDR, "!", "-o", LINK, "-j", "DROP"),
                     ("-s", LAB_NET, "!", "-o", LINK, "-j", "DROP")):
            run("iptables", "-I", "FORWARD", "1", *rule, "-m", "comment", "--comment", "pglab-kube-lab")
        for node in self.nodes:
            run("ip", "netns", "add", node.netns)
            run("ip", "link", "add", node.veth, "type", "veth", "peer", "name", "eth0", "netns", node.netns)
            run("ip", "link", "set", node.veth, "master", LINK, "up")
            inside = ("nsenter", f"--net=/run/netns/{node.netns}", "--")
            run(*inside, "ip", "link", "set", "lo", "up")
            run(*inside, "ip", "addr", "add", f"{node.ip}/24", "dev", "eth0")
            run(*inside, "ip", "link", "set", "eth0", "up")
            run(*inside, "ip", "route", "add", "default", "via", API_IP)  # Service addresses before kube-proxy's DNAT
            run(*inside, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            run(*inside, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1", check=False)
            run("ip", "route", "add", node.subnet, "via", node.ip)
            if node.system:  # Service addresses from this machine: through that node's kube-proxy (it masquerades
                run("ip", "route", "add", SERVICE_CIDR, "via", node.ip)  # sources outside the pod network)
            for other in self.nodes:
                if other is not node:
                    run(*inside, "ip", "route", "add", other.subnet, "via", other.ip)

    def _prepare_node(self, node: Node) -> None:
        """The node's folders, disk, cgroup and configuration, and the commands that start its daemons (kept in
        its folder, so that ``kubelab.py node start`` can start a stopped node again from another process)."""
        r, b, pki = node_root(self.root, node.name), self.bin, self.root / "pki"
        for d in ("etc/cni", "var", "run", "log", *DISKS.values()):
            (r / d).mkdir(parents=True, exist_ok=True)
        mkfs = ("mkfs.xfs", "-q", "-f") if node.fstype == "xfs" else ("mkfs.ext4", "-q", "-F", "-E",
                                                                       "lazy_itable_init=0,lazy_journal_init=0")
        devices: dict[str, str] = {}
        for disk, size in ((DISKS[STORAGE_CLASS], DISK_BYTES), (DISKS[THROTTLED_CLASS], SLOW_DISK_BYTES)):
            image = r / f"{disk}.img"
            with open(image, "wb") as f:
                f.truncate(size)
            run(*mkfs, image, timeout=300)
            # direct I/O: the loop device writes through to the backing file as a disk does, without a second page
            # cache
            loop = devices[disk] = run("losetup", "--find", "--show", "--direct-io=on", image).stdout.strip()
            if disk == DISKS[THROTTLED_CLASS]:
                set_throttle(Path("/sys/fs/cgroup/blkio"), device_number(loop))  # the kernel's threads' I/O
            run("mount", loop, r / disk)
            (r / disk / "pv").mkdir()
            (r / disk / "pv").chmod(0o755)
        for hierarchy in cgroup_hierarchies():
            path = hierarchy / CGROUP / node.name
            path.mkdir(parents=True, exist_ok=True)
            if (hierarchy / "cpuset.cpus").exists():  # a cpuset takes no process before it has CPUs and memory
                for part in (hierarchy / CGROUP, path):
                    for knob in ("cpuset.cpus", "cpuset.mems"):
                        if not (part / knob).read_text().strip():
                            (part / knob).write_text((part.parent / knob).read_text())
        (r / "etc/containerd.toml").write_text(f"""version = 2
root = "{r}/var/containerd"
state = "{r}/run/containerd"
[grpc]
  address = "{r}/run/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{self.image_names['pause']}"
  enable_unprivileged_ports = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{r}/etc/cni"
""")
        (r / "etc/cni/10-pglab-kube-lab.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "pglab-kube-lab", "plugins": [
                {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": node.subnet}]],
                          "routes": [{"dst": "0.0.0.0/0"}], "dataDir": f"{r}/var/cni"}},
                {"type": "portmap", "capabilities": {"portMappings": True}}]}))
        (r / "etc/resolv.conf").write_text("search cluster.local\n")  # no nameserver: nothing reaches the host's
        (r / "etc/kubelet.yaml").write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs", "failCgroupV1": False, "cgroupRoot": f"/{CGROUP}/{node.name}",
            "address": node.ip, "healthzBindAddress": "127.0.0.1",
            "containerRuntimeEndpoint": f"unix://{r}/run/containerd.sock",
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": f"{pki}/ca.crt"}},
            "authorization": {"mode": "Webhook"}, "clusterDomain": "cluster.local", "clusterDNS": [DNS_IP],
            # each node's own pod logs: in the shared default (/var/log/pods) the kubelets' log GC removes the
            # folders of each other's pods
            "podLogsDir": f"{r}/var/log-pods",
            "resolvConf": f"{r}/etc/resolv.conf", "tlsCertFile": f"{pki}/kubelet-{node.name}.crt",
            "tlsPrivateKeyFile": f"{pki}/kubelet-{node.name}.key", "failSwapOn": False,
            "imageGCHighThresholdPercent": 99, "imageGCLowThresholdPercent": 98,
            "evictionHard": {"memory.available": "200Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "maxPods": 60, "serializeImagePulls": False}))
        closed = "http://127.0.0.1:9"
        daemons = {
            # Every image is imported at start, so a pull is a mistake (a misspelt name) and must not leave the
            # machine: containerd's registry requests go to a proxy on a closed local port, and fail at once.
            "containerd": {"cmd": ["containerd", "--config", f"{r}/etc/containerd.toml"],
                           "env": {"HTTP_PROXY": closed, "HTTPS_PROXY": closed, "NO_PROXY": "", "http_proxy": closed,
                                   "https_proxy": closed, "no_proxy": ""}},
            "kubelet": {"cmd": [
                f"{b}/kubelet", f"--config={r}/etc/kubelet.yaml",
                f"--kubeconfig={self.root}/kubelet-{node.name}.kubeconfig",
                f"--hostname-override={node.name}", f"--node-ip={node.ip}", f"--root-dir={r}/var/kubelet",
                f"--cert-dir={r}/var/kubelet-pki", "--v=1",
                f"--containerd={r}/run/containerd.sock",  # cAdvisor's: the pods' labels on /metrics/cadvisor
                "--node-labels=" + ",".join(f"{k}={v}" for k, v in node.labels.items()),
                # cAdvisor reads the containers' cgroups every 2 s (default 10 s): a 10 s run's container CPU from
                # /metrics/cadvisor then has samples inside its window (tests/test_kube_lab_scale.py)
                f"--housekeeping-interval={HOUSEKEEPING_S}s"]},
            "kube-proxy": {"cmd": [
                f"{b}/kube-proxy", f"--kubeconfig={self.root}/kube-proxy.kubeconfig",
                f"--hostname-override={node.name}",
                "--proxy-mode=iptables", f"--cluster-cidr={POD_CIDR}", "--conntrack-max-per-core=0",
                "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
                "--bind-address=127.0.0.1", "--metrics-bind-address=127.0.0.1:10249",
                "--healthz-bind-address=127.0.0.1:10256"]},
            "provisioner": {"cmd": [str(self.provisioner), f"--kubeconfig={self.kubeconfig}",
                                    f"--root={r}/disk/pv", f"--node={node.name}", f"--class={STORAGE_CLASS}"]},
            "provisioner-throttled": {"cmd": [
                str(self.provisioner), f"--kubeconfig={self.kubeconfig}", f"--root={r}/slow/pv",
                f"--node={node.name}", f"--class={THROTTLED_CLASS}"]},
            "throttle": {"cmd": [sys.executable, str(Path(__file__).resolve()), "throttle", node.name,
                                 device_number(devices[DISKS[THROTTLED_CLASS]])]},
        }
        (r / "daemons.json").write_text(json.dumps(daemons, indent=1))

    def _import_images(self) -> None:
        """Every image into every node's containerd: its root linked from the seed (``_seed``), else one import per
        node, the nodes side by side (five imports of 700 MiB wrote 8 GiB at every start: 37 s of a quiet lab's 61 s
        to ready)."""
        t0 = time.monotonic()
        seed = self._seed()
        for node in self.nodes:
            if seed is not None:
                link_seed(seed, node_root(self.root, node.name) / "var/containerd")
            _spawn_daemon(self.root, node.name, "containerd")
        imports = []
        for node in self.nodes:
            sock = node_root(self.root, node.name) / "run/containerd.sock"
            # answering, not only its socket made: once an import found the socket there and was refused (CI, loaded)
            self._wait(f"{node.name}/containerd", "serving",
                       lambda sock=sock: run("ctr", "-a", sock, "version", check=False, timeout=10).returncode == 0)
            if seed is None:
                imports.append((node, import_images(sock, self.images)))
        for node, proc in imports:
            out, _ = proc.communicate(timeout=900)
            if proc.returncode != 0:
                raise LabError(f"importing the images into {node.name} failed: {out.strip()[-400:]}")
        self.timings["image_import_s"] = time.monotonic() - t0

    def _seed(self) -> Path | None:
        """The containerd root every node's is linked from: the lab cache's for these images, else one made now in
        the lab's folder (then moved into the cache); None when the lab's folder is on another filesystem than the
        cache, where links cannot be made (each node then imports the images itself)."""
        cached = seed_path(self.images)
        if os.stat(self.root).st_dev != os.stat(cached.parent).st_dev:
            return None
        if (cached / ".complete").exists():
            return cached / "root"
        t0 = time.monotonic()
        made = self.root / "seed"
        run_dir = made / "run"
        run_dir.mkdir(parents=True)
        config = made / "containerd.toml"
        config.write_text(f'version = 2\nroot = "{made}/root"\nstate = "{run_dir}/state"\n'
                          f'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n[grpc]\n  address = "{run_dir}/sock"\n')
        self._spawn("seed/containerd", "containerd", "--config", config)
        try:
            sock = run_dir / "sock"
            self._wait("seed/containerd", "serving",
                       lambda: run("ctr", "-a", sock, "version", check=False, timeout=10).returncode == 0)
            proc = import_images(sock, self.images)
            out, _ = proc.communicate(timeout=900)
            if proc.returncode != 0:
                raise LabError(f"importing the images into the nodes' seed failed: {out.strip()[-400:]}")
        finally:  # stopped before it is copied: its databases closed
            pid = _alive(self.root, "seed/containerd")
            _kill([pid] if pid else [], signal.SIGTERM, 30)
            _kill([pid] if pid and start_time(pid) else [], signal.SIGKILL, 5)
        self.timings["image_seed_s"] = time.monotonic() - t0
        return publish_seed(made / "root", cached)

    def _spawn(self, name: str, *cmd: str | Path) -> None:
        _spawn(self.root, name, [str(c) for c in cmd], {}, None)

    def _wait(self, name: str, what: str, probe: Any, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if probe():
                    return
            pid = _pids(self.root).get(name, [None])[0]
            if pid is not None and start_time(pid) is None:
                raise LabError(f"{name} exited while the lab started: {_log_tail(self.root, name)}")
            time.sleep(0.3)
        raise LabError(f"{name} was not {what} after {timeout:.0f} s: {_log_tail(self.root, name)}")

    def _control_plane(self) -> None:
        r, b, pki = self.root, self.bin, self.root / "pki"
        (r / "log").mkdir(exist_ok=True)
        self._spawn("etcd", b / "etcd", "--name", "lab", "--data-dir", r / "var/etcd",
                    "--listen-client-urls", "http://127.0.0.1:22379", "--advertise-client-urls",
                    "http://127.0.0.1:22379", "--listen-peer-urls", "http://127.0.0.1:22380",
                    "--initial-advertise-peer-urls", "http://127.0.0.1:22380",
                    "--initial-cluster", "lab=http://127.0.0.1:22380", "--listen-metrics-urls",
                    "http://127.0.0.1:22381", "--quota-backend-bytes", "2147483648", "--unsafe-no-fsync")
        self._wait("etcd", "healthy", lambda: run("curl", "-sf", "http://127.0.0.1:22381/health", check=False,
                                                  timeout=5).returncode == 0)
        self._spawn("kube-apiserver", b / "kube-apiserver", "--etcd-servers=http://127.0.0.1:22379",
                    f"--bind-address={API_IP}", f"--advertise-address={API_IP}", "--secure-port=6443",
                    f"--service-cluster-ip-range={SERVICE_CIDR}", f"--client-ca-file={pki}/ca.crt",
                    f"--tls-cert-file={pki}/apiserver.crt", f"--tls-private-key-file={pki}/apiserver.key",
                    f"--kubelet-client-certificate={pki}/apiserver-kubelet-client.crt",
                    f"--kubelet-client-key={pki}/apiserver-kubelet-client.key",
                    f"--service-account-key-file={pki}/sa.pub", f"--service-account-signing-key-file={pki}/sa.key",
                    "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                    "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
                    "--kubelet-preferred-address-types=InternalIP",  # the node names are in no DNS
                    # webhooks (the operator's) reached at their pods' addresses: no kube-proxy on this machine
                    "--enable-aggregator-routing=true",
                    "--allow-privileged=true", "--profiling=false", "--event-ttl=30m")
        self._wait("kube-apiserver", "ready", lambda: run(
            "curl", "-sf", "--cacert", pki / "ca.crt", "--cert", pki / "admin.crt", "--key", pki / "admin.key",
            f"https://{API_IP}:6443/readyz", check=False, timeout=5).returncode == 0)
        self._spawn("kube-controller-manager", b / "kube-controller-manager",
                    f"--kubeconfig={r}/controller-manager.kubeconfig",
                    f"--authentication-kubeconfig={r}/controller-manager.kubeconfig",
                    f"--authorization-kubeconfig={r}/controller-manager.kubeconfig", "--bind-address=127.0.0.1",
                    "--leader-elect=false", "--use-service-account-credentials=true",
                    f"--cluster-signing-cert-file={pki}/ca.crt", f"--cluster-signing-key-file={pki}/ca.key",
                    f"--root-ca-file={pki}/ca.crt", f"--service-account-private-key-file={pki}/sa.key",
                    f"--service-cluster-ip-range={SERVICE_CIDR}", "--profiling=false",
                    f"--node-monitor-grace-period={NODE_MONITOR_GRACE_S}s")
        self._spawn("kube-scheduler", b / "kube-scheduler", f"--kubeconfig={r}/scheduler.kubeconfig",
                    f"--authentication-kubeconfig={r}/scheduler.kubeconfig",
                    f"--authorization-kubeconfig={r}/scheduler.kubeconfig", "--bind-address=127.0.0.1",
                    "--leader-elect=false", "--profiling=false")

    def _nodes_ready(self) -> bool:
        nodes = json.loads(self.kubectl("get", "nodes", "-o", "json", timeout=10).stdout)["items"]
        ready = {n["metadata"]["name"] for n in nodes
                 if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])}
        return ready >= {n.name for n in self.nodes}

    def _addons(self) -> None:
        self.kubectl("apply", "-f", self.images / "coredns.yaml")
        self.kubectl("apply", "--server-side", "-f", self.images / "cnpg-operator.yaml", timeout=180)
        for ns, deploy in (("kube-system", "coredns"), ("cnpg-system", "cnpg-controller-manager")):
            proc = self.kubectl("-n", ns, "rollout", "status", f"deploy/{deploy}", f"--timeout={START_TIMEOUT_S}s",
                                check=False, timeout=START_TIMEOUT_S + 30)
            if proc.returncode != 0:
                raise LabError(f"{deploy} did not become ready in {START_TIMEOUT_S} s: "
                               f"{(proc.stderr or proc.stdout).strip()[-300:]}")
        # The operator's admission webhook answers only once its certificate is in place: ask for a dry-run Cluster
        # until it is accepted, so that the first real Cluster is not refused.
        probe = self.root / "probe-cluster.json"
        probe.write_text(json.dumps({
            "apiVersion": "postgresql.cnpg.io/v1", "kind": "Cluster", "metadata": {"name": "probe",
                                                                                   "namespace": "default"},
            "spec": {"instances": 1, "imageName": self.image_names["postgresql_full"], "storage": {"size": "1Gi"}}}))
        self._wait("cnpg-controller-manager", "admitting Clusters", lambda: self.kubectl(
            "create", "--dry-run=server", "-f", probe, check=False, timeout=20).returncode == 0)


# ---------------------------------------------------------------------- the nodes' images, linked from a seed
# What a node's containerd root may share with the seed's and the other nodes': the content store's blobs (named by
# their digest, never written again) and the unpacked layers (committed snapshots: read-only lower layers of the
# containers' overlays). Everything else (its databases above all) is each node's own copy.
SEED_LINKED = ("io.containerd.content.v1.content/blobs", "io.containerd.snapshotter.v1.overlayfs/snapshots")


def seed_path(images: Path) -> Path:
    """The lab cache's seed for an images build and this machine's containerd (whose databases' layout it is):
    ``root/`` (a stopped containerd's root holding every image, unpacked) and ``.complete``."""
    version = run("containerd", "--version").stdout.strip()
    return images.parent / f"seed-{images.name}-{hashlib.sha256(version.encode()).hexdigest()[:8]}"


def import_images(sock: Path, images: Path) -> subprocess.Popen[str]:
    """Every image tarball of ``images`` imported (and unpacked) into the containerd at ``sock``, one at a time."""
    cmd = " && ".join(f"ctr -a {sock} -n k8s.io images import --no-unpack=false {tar}"
                      for tar in sorted(images.glob("*.tar")))
    return subprocess.Popen(["sh", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def link_seed(seed: Path, dest: Path) -> None:
    """A node's containerd root made from the seed: SEED_LINKED as hard links, the rest copied (the introspection
    service's uuid left out: each containerd makes its own)."""
    linked = {seed / part for part in SEED_LINKED}

    def ignore(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if Path(folder, n) in linked or (n == "uuid" and folder.endswith("introspection"))]

    shutil.copytree(seed, dest, symlinks=True, ignore=ignore)
    for part in SEED_LINKED:
        if (seed / part).exists():
            run("cp", "-al", seed / part, dest / part, timeout=300)


def publish_seed(made: Path, final: Path) -> Path:
    """The seed made in a lab's folder moved into the lab cache at ``final`` (its ``seed_path``: a rename, the same
    filesystem), complete or not there at all; the folder it is in now."""
    for stale in final.parent.glob(f"{final.name}.tmp-*"):  # a publish interrupted between its two renames
        shutil.rmtree(stale, ignore_errors=True)
    tmp = final.parent / f"{final.name}.tmp-{os.getpid()}"
    try:
        tmp.mkdir()
        made.rename(tmp / "root")
        (tmp / ".complete").touch()
        tmp.rename(final)
    except OSError:
        return made if made.exists() else tmp / "root"
    return final / "root"


# ---------------------------------------------------------------------- the object store, when a test asks for it
OBJECTSTORE_NS = "objectstore"
OBJECTSTORE_URL = "http://s3.objectstore.svc:7070"   # in the lab (CoreDNS), as versitygw.yaml's Service names it
OBJECTSTORE_SECRET = "s3-credentials"                 # in OBJECTSTORE_NS: ACCESS_KEY_ID, ACCESS_SECRET_KEY
OBJECTSTORE_BUCKET = "pglab"                          # the bucket the plans and tests name (s3://pglab/...)
OBJECTSTORE_UID = 1000                                # versitygw's user in its pod (versitygw.yaml)
PLUGIN_NAME = "barman-cloud.cloudnative-pg.io"


def objectstore_build() -> Path:
    """This checkout's build of tools/kube-lab/objectstore/build.sh (``PGLAB_KUBE_LAB_OBJECTSTORE``, which
    ./setup.sh sets from it), else the newest complete build in the lab cache
    with versitygw (an older one with MinIO, kept for a checkout of before, is passed over)."""
    if given := os.environ.get("PGLAB_KUBE_LAB_OBJECTSTORE"):
        if not (Path(given) / ".complete").exists():
            raise LabError(f"PGLAB_KUBE_LAB_OBJECTSTORE={given} is not a complete object store build; run "
                           "tools/kube-lab/objectstore/build.sh GO, which prints the one to use")
        return Path(given)
    return newest_build("objectstore", "./setup.sh kube-lab (or tools/kube-lab/objectstore/build.sh GO)",
                        having="versitygw.yaml")


def start_objectstore(root: Path, build: Path | None = None) -> dict[str, float]:
    """The lab's object store (versitygw, an S3 gateway whose posix backend keeps each object as a file; namespace
    ``objectstore``, on the system node, with the bucket ``pglab``) and CloudNativePG's Barman Cloud plugin
    (``cnpg-system``), started in a running lab only when asked (a test or plan that archives WAL), so the lab's ready
    time for everything else does not grow: their images imported into the nodes that run them (the sidecar into
    every node that may run an instance), the plugin's two mTLS secrets made with openssl, both rolled out and the
    plugin's CRD served. Returns the seconds each step took. Running it again changes nothing. Nothing is
    kept outside the lab's folder: ``down`` removes it with the nodes' containerd."""
    build = build or objectstore_build()
    state = json.loads((root / "lab.json").read_text())
    bin_dir, nodes = Path(state["bin"]), recorded_nodes(root)

    def kubectl(*args: str | Path, timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
        return run(bin_dir / "kubectl", "--kubeconfig", root / "admin.kubeconfig", *args, timeout=timeout, **kw)

    timings: dict[str, float] = {}
    t0 = time.monotonic()
    imports = []
    for node in nodes:
        tars = ([build / "images/versitygw.tar", build / "images/plugin-barman-cloud.tar"] if node.system else [])
        if node.role != "client":  # database nodes, or the one node of a 1-node lab: instances run there
            tars.append(build / "images/plugin-barman-cloud-sidecar.tar")
        sock = node_root(root, node.name) / "run/containerd.sock"
        cmd = " && ".join(f"ctr -a {sock} -n k8s.io images import --no-unpack=false {tar}" for tar in tars)
        if cmd:
            imports.append((node, subprocess.Popen(["sh", "-c", cmd], stdout=subprocess.PIPE,
                                                   stderr=subprocess.STDOUT, text=True)))
    for node, importing in imports:
        out, _ = importing.communicate(timeout=900)
        if importing.returncode != 0:
            raise LabError(f"importing the object store's images into {node.name} failed: {out.strip()[-400:]}")
    timings["image_import_s"] = time.monotonic() - t0
    t1 = time.monotonic()
    kubectl("apply", "-f", build / "versitygw.yaml")
    certs = run(Path(__file__).parent / "objectstore" / "plugin-certs.sh", "cnpg-system").stdout
    if kubectl("-n", "cnpg-system", "get", "secret", "barman-cloud-server-tls", check=False).returncode != 0:
        kubectl("apply", "-f", "-", input=certs)
    kubectl("apply", "--server-side", "-f", build / "barman-cloud-plugin.yaml", timeout=180)
    for ns, deploy in ((OBJECTSTORE_NS, "versitygw"), ("cnpg-system", "barman-cloud")):
        proc = kubectl("-n", ns, "rollout", "status", f"deploy/{deploy}", f"--timeout={START_TIMEOUT_S}s",
                       check=False, timeout=START_TIMEOUT_S + 30)
        if proc.returncode != 0:
            raise LabError(f"{ns}/{deploy} did not become ready in {START_TIMEOUT_S} s: "
                           f"{(proc.stderr or proc.stdout).strip()[-300:]}")
    kubectl("wait", "--for=condition=Established", "crd/objectstores.barmancloud.cnpg.io", "--timeout=60s",
            timeout=90)
    # The bucket: with versitygw's posix backend a bucket is a top-level folder of its data folder (the root user,
    # whose credentials the plans use, owns every bucket), made here on the system node's disk as versitygw's user.
    pod = kubectl("-n", OBJECTSTORE_NS, "get", "pod", "-l", "app=versitygw", "--field-selector=status.phase=Running",
                  "-o", "jsonpath={.items[0].metadata.uid} {.items[0].spec.nodeName}").stdout.split()
    if len(pod) != 2:
        raise LabError(f"no running versitygw pod in {OBJECTSTORE_NS}")
    data = node_root(root, pod[1]) / "var/kubelet/pods" / pod[0] / "volumes/kubernetes.io~empty-dir/data"
    bucket = data / OBJECTSTORE_BUCKET
    if not bucket.is_dir():
        bucket.mkdir(mode=0o755)
        os.chown(bucket, OBJECTSTORE_UID, OBJECTSTORE_UID)
    timings["rollout_s"] = time.monotonic() - t1
    timings["objectstore_s"] = time.monotonic() - t0
    return timings


# ---------------------------------------------------------------------- the slow disk's throttle
def provisioner_key() -> str:
    """The key build.sh gives this checkout's provisioner build: its source and the module's go.mod/go.sum."""
    here = Path(__file__).resolve().parent
    files = sorted(str(p.relative_to(here)) for p in (here / "k8s/cmd/hostpath-provisioner").rglob("*") if p.is_file())
    lines = "".join(f"{hashlib.sha256((here / f).read_bytes()).hexdigest()}  {f}\n"
                    for f in sorted([*files, "k8s/go.mod", "k8s/go.sum"]))
    return hashlib.sha256(lines.encode()).hexdigest()[:16]


def device_number(device: str) -> str:
    """``major:minor`` of a block device (/dev/loopN), as the blkio files name it."""
    rdev = os.stat(device).st_rdev
    return f"{os.major(rdev)}:{os.minor(rdev)}"


def set_throttle(cgroup: Path, device: str, limits: dict[str, int] | None = None) -> None:
    """Writes THROTTLE (or ``limits``; 0 removes a rule) for ``device`` into one blkio cgroup."""
    for name, value in (THROTTLE if limits is None else limits).items():
        (cgroup / f"blkio.throttle.{name}").write_text(f"{device} {value}\n")


def throttle(node_name: str, device: str) -> None:
    """A node's throttle daemon: THROTTLE for ``device`` in every blkio cgroup of the node, the new ones within
    THROTTLE_POLL_S of their creation (before runc starts a container's process in it, mostly), until killed."""
    base = Path("/sys/fs/cgroup/blkio") / CGROUP / node_name
    done: set[str] = set()
    while True:
        seen: set[str] = set()
        for path, _dirs, _files in os.walk(base):
            seen.add(path)
            if path not in done:
                with contextlib.suppress(OSError):  # a cgroup removed meanwhile
                    set_throttle(Path(path), device)
                    done.add(path)
        done &= seen
        time.sleep(THROTTLE_POLL_S)


def clear_throttle(device_path: str) -> None:
    """Removes the root cgroup's rules for a slow disk's loop device (before it is detached: the rules outlive it)."""
    with contextlib.suppress(OSError):
        set_throttle(Path("/sys/fs/cgroup/blkio"), device_number(device_path), {k: 0 for k in THROTTLE})


# ---------------------------------------------------------------------- processes, by the state the lab keeps
def node_root(root: Path, name: str) -> Path:
    return root / "nodes" / name


def recorded_nodes(root: Path) -> list[Node]:
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return [Node(**n) for n in json.loads((root / "lab.json").read_text())["nodes"]]
    return []


def cgroup_hierarchies() -> list[Path]:
    """The mounted cgroup v1 hierarchies (cpu, memory, pids, …): the lab's cgroups are made in each."""
    return [Path(line.split()[1]) for line in Path("/proc/mounts").read_text().splitlines()
            if line.split()[2] == "cgroup"]


@contextlib.contextmanager
def _pids_locked(root: Path) -> Iterator[dict[str, list[Any]]]:
    """pids.json (name → [pid, start time]) read and written under a lock: a node's restart by 'kubelab.py node
    start' and the lab's owner both record there."""
    with open(root / "pids.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        pids = _pids(root)
        yield pids
        tmp = root / "pids.json.tmp"
        tmp.write_text(json.dumps(pids))
        tmp.replace(root / "pids.json")


def _pids(root: Path) -> dict[str, list[Any]]:
    with contextlib.suppress(OSError, ValueError):
        return dict(json.loads((root / "pids.json").read_text()))
    return {}


def _spawn(root: Path, name: str, cmd: list[str], env: dict[str, str], node: Node | None) -> None:
    """Starts one of the lab's processes in its own session, logging to log/<name>.log; a node's in that node's
    network namespace and cgroup."""
    cgroups: list[Path] = []
    if node is not None:
        cmd = ["nsenter", f"--net=/run/netns/{node.netns}", "--", *cmd]
        cgroups = [h / CGROUP / node.name / "cgroup.procs" for h in cgroup_hierarchies()]

    def join_cgroups() -> None:  # in the child, before exec: everything it starts is the node's
        for procs in cgroups:
            with open(procs, "w") as f:
                f.write("0")

    log_path = root / "log" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=root, env={**os.environ, **env},
                                preexec_fn=join_cgroups if cgroups else None)
    with _pids_locked(root) as pids:
        pids[name] = [proc.pid, start_time(proc.pid)]


def _spawn_daemon(root: Path, node_name: str, daemon: str) -> None:
    node = next(n for n in recorded_nodes(root) if n.name == node_name)
    spec = json.loads((node_root(root, node_name) / "daemons.json").read_text())[daemon]
    _spawn(root, f"{node_name}/{daemon}", spec["cmd"], spec.get("env", {}), node)


def _log_tail(root: Path, name: str) -> str:
    with contextlib.suppress(OSError):
        lines = (root / "log" / f"{name}.log").read_text(errors="replace").strip().splitlines()
        return " | ".join(lines[-3:])[-600:]
    return "(no log)"


def _alive(root: Path, name: str) -> int | None:
    pid, started = _pids(root).get(name, [None, None])
    return pid if pid is not None and start_time(pid) == started else None


def _kill(pids: list[int], sig: int, wait: float) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and any(start_time(p) is not None for p in pids):
        time.sleep(0.1)


def cgroup_procs(path: str) -> list[int]:
    """Every process in a cgroup of the lab and below it (the pids hierarchy: each process is in exactly one)."""
    base = Path("/sys/fs/cgroup/pids") / path
    found: list[int] = []
    for procs in base.rglob("cgroup.procs") if base.exists() else []:
        with contextlib.suppress(OSError, ValueError):
            found += [int(p) for p in procs.read_text().split()]
    return found


def start_node(root: Path, name: str) -> None:
    """Starts a node's daemons (containerd first) and brings its link up: a node started again after
    ``stop_node`` finds its containers dead, as a machine that powered off does."""
    node = next((n for n in recorded_nodes(root) if n.name == name), None)
    if node is None:
        raise LabError(f"no node {name} in the lab at {root}")
    run("ip", "link", "set", node.veth, "up")
    for daemon in reversed(NODE_DAEMONS):
        if _alive(root, f"{name}/{daemon}") is None:
            _spawn_daemon(root, name, daemon)
        if daemon == "containerd":
            sock = node_root(root, name) / "run/containerd.sock"
            deadline = time.monotonic() + START_TIMEOUT_S
            while run("ctr", "-a", sock, "version", check=False, timeout=10).returncode != 0:
                if time.monotonic() > deadline or _alive(root, f"{name}/containerd") is None:
                    raise LabError(f"containerd of {name} did not start: {_log_tail(root, f'{name}/containerd')}")
                time.sleep(0.2)


# A process killed while in uninterruptible sleep (its write to a loop device on a loaded disk) dies only when that I/O
# ends: seconds on a busy machine; 20 s was not always enough with the machine's disk shared by a Go build and tests
KILL_WAIT_S = 120.0


def stop_node(root: Path, name: str) -> None:
    """The node dies as a machine does: every process of it (its daemons, its containers and their shims) is
    killed at once and its link goes down; nothing is cleaned up (mounts, pod network namespaces and the API's
    objects stay as a dead machine leaves them)."""
    node = next((n for n in recorded_nodes(root) if n.name == name), None)
    if node is None:
        raise LabError(f"no node {name} in the lab at {root}")
    run("ip", "link", "set", node.veth, "down", check=False)  # cut off at once: the rest only has to die
    deadline = time.monotonic() + KILL_WAIT_S
    while procs := cgroup_procs(f"{CGROUP}/{name}"):
        if time.monotonic() > deadline:
            states = ", ".join(f"{pid} {_state(pid)}" for pid in procs)
            raise LabError(f"processes of node {name} survived SIGKILL for {KILL_WAIT_S:.0f} s: {states}")
        _kill(procs, signal.SIGKILL, 1)


def _state(pid: int) -> str:
    """A process's state letter and name (D: uninterruptible sleep, in the kernel until its I/O ends)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return f"{stat.rsplit(')', 1)[1].split()[0]} ({stat[stat.index('(') + 1:stat.rindex(')')]})"


def stop_lab(root: Path) -> None:
    """Stops a lab's processes (the control plane by the pids it recorded, the nodes by their cgroups), unmounts
    what its kubelets and containerds mounted and the nodes' disks, and removes the pods' and nodes' network
    namespaces, the loop devices, the cgroups, the bridge and the rules. Runs whatever state it finds."""
    nodes = recorded_nodes(root)
    daemons = [f"{n.name}/{d}" for n in nodes for d in NODE_DAEMONS]
    for group in (daemons, list(CP_STOP_ORDER)):
        found = [p for name in group if (p := _alive(root, name)) is not None]
        _kill(found, signal.SIGTERM, 10)
        _kill(found, signal.SIGKILL, 5)
    for node in nodes:
        with contextlib.suppress(LabError):
            stop_node(root, node.name)
    etcd = _alive(root, "etcd")
    _kill([etcd] if etcd else [], signal.SIGTERM, 10)
    # anything else that names the lab's folder (a shim moved out of its cgroup, a lab of an older layout)
    for _ in range(3):
        left = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _mentions(p, str(root))
                and int(p.name) != os.getpid()]
        _kill(left, signal.SIGKILL, 1)
        if not left:
            break
    _remove_pod_netns(root)
    for mount in sorted((line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                         if line.split()[1].startswith(str(root) + "/")), reverse=True):
        if run("umount", mount, check=False).returncode != 0:
            run("umount", "-l", mount, check=False)
    for node in nodes:
        for disk in DISKS.values():
            image = node_root(root, node.name) / f"{disk}.img"
            for line in run("losetup", "-j", image, check=False).stdout.splitlines():
                if disk == DISKS[THROTTLED_CLASS]:
                    clear_throttle(line.split(":", 1)[0])
                run("losetup", "-d", line.split(":", 1)[0], check=False)
        run("ip", "netns", "del", node.netns, check=False)
        run("ip", "link", "del", node.veth, check=False)
    _remove_cgroups()
    # what the kubelets and the CNI plugins write outside the lab's folder: /var/log/containers' links into the
    # nodes' pod logs, and the cached results of the lab's network
    for link in Path("/var/log/containers").glob("*.log") if Path("/var/log/containers").exists() else []:
        with contextlib.suppress(OSError):
            if os.readlink(link).startswith(str(root) + "/"):
                link.unlink()
    # (containerd's loopback results are named by sandbox only: those of the lab's sandboxes, and any written
    # while it ran, since one lab runs per machine)
    started = (root / "pki").stat().st_mtime if (root / "pki").exists() else time.time()
    sandboxes = {d.name for d in root.glob("nodes/*/*/containerd/io.containerd.grpc.v1.cri/sandboxes/*")}
    for cached in Path("/var/lib/cni/results").glob("*") if Path("/var/lib/cni/results").exists() else []:
        with contextlib.suppress(OSError):
            if (cached.name.startswith("pglab-kube-lab-") or any(f"-{s}-" in cached.name for s in sandboxes)
                    or cached.stat().st_mtime >= started):
                cached.unlink()
    while True:
        rules = [r for r in run("iptables", "-S", "FORWARD", check=False).stdout.splitlines()
                 if "pglab-kube-lab" in r and r.startswith("-A ")]
        if not rules or run("iptables", *rules[0].replace("-A ", "-D ", 1).split(), check=False).returncode != 0:
            break
    run("ip", "link", "del", LINK, check=False)
    with contextlib.suppress(OSError):
        (root / "pids.json").unlink()


def _remove_pod_netns(root: Path) -> None:
    """The pods' network namespaces (containerd's /run/netns/cni-*: kept by a mount of their own, which outlives
    the pods) that belong to the lab: those with an address in its pod network, or left with none since the lab
    started (their veth went with the node's namespace)."""
    started = (root / "pki").stat().st_mtime if (root / "pki").exists() else time.time()
    for ns in Path("/run/netns").glob("cni-*") if Path("/run/netns").exists() else []:
        addrs = run("nsenter", f"--net={ns}", "--", "ip", "-o", "-4", "addr", "show", check=False).stdout
        ours = " 10.244." in addrs or (" inet " not in addrs.replace("inet 127.0.0.1", "")
                                       and ns.stat().st_mtime >= started - 1)
        if ours:
            run("ip", "netns", "del", ns.name, check=False)


def _remove_cgroups() -> None:
    """The lab's cgroup in every hierarchy, the unified (cgroup v2) one of a hybrid machine too: runc makes the
    containers' cgroups there as well."""
    unified = [Path(line.split()[1]) for line in Path("/proc/mounts").read_text().splitlines()
               if line.split()[2] == "cgroup2"]
    for hierarchy in cgroup_hierarchies() + unified:
        base = hierarchy / CGROUP
        if base.exists():
            for d in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    d.rmdir()
            with contextlib.suppress(OSError):
                base.rmdir()


def _mentions(proc: Path, text: str) -> bool:
    try:
        return text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False


def _running(root: Path) -> bool:
    """Whether any process the lab in ``root`` started is still alive."""
    return any(start_time(pid) == started for pid, started in _pids(root).values())


def clean_orphan() -> str | None:
    """Stops the lab recorded in the state folder if its owner is gone (a lab of 'up' has none: it is left alone
    while its processes run). Returns a sentence when it stopped one."""
    state = state_file()
    try:
        data = json.loads(state.read_text())
    except (OSError, ValueError):
        return None
    if data.get("kept") and _running(Path(data["root"])):
        return None
    if not data.get("kept") and start_time(data["pid"]) == data.get("pid_start"):
        return None
    root = Path(data["root"])
    stop_lab(root)
    shutil.rmtree(root, ignore_errors=True)
    state.unlink(missing_ok=True)
    return f"stopped and removed the Kubernetes lab {root} left behind by pid {data['pid']}"


def running_root() -> Path:
    try:
        return Path(json.loads(state_file().read_text())["root"])
    except (OSError, ValueError, KeyError):
        raise LabError("no Kubernetes lab is running (kubelab.py up starts one)") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a lab and leave it running until 'down'")
    up.add_argument("--images", type=Path, help="images folder of a build (default: the newest)")
    up.add_argument("--nodes", type=int, default=None,
                    help=f"how many nodes (default {DEFAULT_NODES}: 3 database nodes and 2 client nodes; 1: one node "
                         "for everything, for a machine too small for more)")
    sub.add_parser("objectstore", help="start the object store (versitygw) and CloudNativePG's Barman Cloud plugin in "
                   "the running lab (a plan that archives WAL or takes a backup needs them)")
    sub.add_parser("down", help="stop the running lab")
    sub.add_parser("clean", help="stop a lab whose owner (a test run) is gone")
    thr = sub.add_parser("throttle", help="(a node's daemon, started by the lab) keep the slow disk's blkio limits "
                         "in every cgroup of the node")
    thr.add_argument("node")
    thr.add_argument("device", help="major:minor of the node's slow disk")
    node = sub.add_parser("node", help="stop a node of the running lab as a machine dies, or start it again")
    node.add_argument("action", choices=("stop", "start"))
    node.add_argument("name")
    args = parser.parse_args()
    try:
        if args.cmd == "up":
            lab = KubeLab(args.images, nodes=args.nodes)
            try:
                lab.start()
            except BaseException:
                lab.stop()
                raise
            # The lab outlives this command: it is kept (as pglab's --keep labs) until 'down', and neither the tests
            # nor 'clean' touch it while its processes run.
            state_file().write_text(json.dumps({"root": str(lab.root), "pid": os.getpid(), "pid_start": None,
                                                "kept": True, "started": time.time()}))
            if os.environ.get("SUDO_UID"):  # started with sudo: the invoking user gets the admin credentials
                uid, gid = int(os.environ["SUDO_UID"]), int(os.environ.get("SUDO_GID", "-1"))
                for f in (lab.kubeconfig, lab.root / "pki/admin.key", lab.root / "pki/admin.crt"):
                    os.chown(f, uid, gid)
            nodes = ", ".join(f"{n.name} ({n.role or 'every role'}, {n.fstype})" for n in lab.nodes)
            print(f"Kubernetes lab ready in {lab.timings['ready_s']:.0f} s with {len(lab.nodes)} nodes: {nodes}; "
                  f"storage classes {STORAGE_CLASS} and {THROTTLED_CLASS} ({THROTTLE['write_iops_device']} IOPS "
                  f"and {THROTTLE['write_bps_device'] >> 20} MiB/s each way); "
                  f"images: {', '.join(sorted(set(lab.image_names.values())))}")
            print(f"export KUBECONFIG={lab.kubeconfig}")
        elif args.cmd == "down":
            try:
                root = running_root()
            except LabError:
                print("no Kubernetes lab is running")
                return
            stop_lab(root)
            shutil.rmtree(root, ignore_errors=True)
            state_file().unlink(missing_ok=True)
            print(f"stopped and removed {root}")
        elif args.cmd == "objectstore":
            timings = start_objectstore(running_root())
            print(f"object store {OBJECTSTORE_URL} (Secret {OBJECTSTORE_NS}/{OBJECTSTORE_SECRET}) and the plugin "
                  f"{PLUGIN_NAME} ready in {timings['objectstore_s']:.0f} s (images "
                  f"{timings['image_import_s']:.0f} s)")
        elif args.cmd == "throttle":
            throttle(args.node, args.device)
        elif args.cmd == "node":
            root = running_root()
            (stop_node if args.action == "stop" else start_node)(root, args.name)
            print(f"node {args.name} {'stopped' if args.action == 'stop' else 'started'}")
        else:
            print(clean_orphan() or "no Kubernetes lab left behind")
    except LabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
