#!/usr/bin/env python3
"""A real single-node Kubernetes with the CloudNativePG operator, started as plain processes from what
tools/kube-lab/build.sh built: etcd, the control plane, containerd, kubelet, kube-proxy, CoreDNS, a hostPath
volume provisioner and the operator. pglab's Kubernetes tests run against it, and so can a user:

    sudo .venv/bin/python tools/kube-lab/kubelab.py up      # prints the kubeconfig to use
    sudo .venv/bin/python tools/kube-lab/kubelab.py down

Why it is built this way:
- No network leaves the machine. The node's address is on a portless bridge of its own (10.245.0.1), which is
  also the only address the API server and the kubelet listen on; pods live on a bridge with no masquerading and
  a FORWARD rule drops whatever they send anywhere but to each other and to this machine; CoreDNS answers only
  for the cluster's names (no upstream).
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
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

NODE = "pglab-kube-lab"
NODE_IP = "10.245.0.1"          # on the lab's own portless bridge: nothing listens on the machine's own addresses
LINK = "pglabkube0"
POD_CIDR = "10.244.0.0/16"
POD_SUBNET = "10.244.0.0/24"
SERVICE_CIDR = "10.96.0.0/16"
API_SERVICE_IP = "10.96.0.1"
DNS_IP = "10.96.0.10"
STORAGE_CLASS = "lab-local"
HOUSEKEEPING_S = 2              # cAdvisor's (the kubelet's) container stats interval
START_TIMEOUT_S = 240           # each component; the first start of a slow, busy machine took ~40 s in all
KUBELET_CHAINS = ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT")
STOP_ORDER = ("hostpath-provisioner", "kube-proxy", "kubelet", "kube-scheduler", "kube-controller-manager",
              "kube-apiserver")


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


def newest_images() -> Path:
    """The images folder of the newest complete build in the cache (build.sh prints the one it made)."""
    builds = sorted((p for p in cache_dir().glob("images-*") if (p / ".complete").exists()),
                    key=lambda p: (p / ".complete").stat().st_mtime)
    if not builds:
        raise LabError(f"no Kubernetes lab build in {cache_dir()}: run ./setup.sh test (or ./setup.sh kube-lab), "
                       "which builds it")
    return builds[-1]


def start_time(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def run(*cmd: str | Path, check: bool = True, timeout: float = 120, **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, check=False, **kw)
    if check and proc.returncode != 0:
        raise LabError(f"{' '.join(str(c) for c in cmd[:3])} failed: {(proc.stderr or proc.stdout).strip()[-400:]}")
    return proc


class KubeLab:
    """One lab: ``start()`` brings a ready cluster (node Ready, CoreDNS and the operator rolled out), ``stop()``
    removes every process, mount, network device and rule it made. ``with KubeLab(...) as lab`` does both."""

    def __init__(self, images: Path | None = None, root: Path | None = None) -> None:
        self.images = images or newest_images()
        self.bin = self.images.parent / ("bin-" + self.images.name.split("-", 1)[1][8:])
        self.root = root or Path(tempfile.mkdtemp(prefix="pglab-kube-lab-"))
        self.root.chmod(0o755)
        self.kubeconfig = self.root / "admin.kubeconfig"
        self.image_names: dict[str, str] = json.loads((self.images / "images.json").read_text())
        self.timings: dict[str, float] = {}
        self._pids: dict[str, int] = {}

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
            raise LabError("the Kubernetes lab needs root (it starts containerd, a kubelet and network devices); "
                           "run the tests as root or with sudo")
        if not Path("/sys/fs/cgroup/cpu").exists() and not Path("/sys/fs/cgroup/cgroup.controllers").exists():
            raise LabError("no cgroup file system at /sys/fs/cgroup: a kubelet cannot run here")
        for tool in ("containerd", "runc", "ctr", "iptables", "openssl", "ip"):
            if shutil.which(tool) is None:
                raise LabError(f"{tool} is not installed: run ./setup.sh test, which installs the lab's packages")
        if not (self.bin / "kubelet").exists():
            raise LabError(f"the lab's binaries are missing beside {self.images}: run ./setup.sh test to build them")
        clean_orphan()
        t0 = time.monotonic()
        self._claim()
        self._pki()
        self._configs()
        self._network()
        self._start_processes()
        self.timings["start_s"] = time.monotonic() - t0
        self._addons()
        self.timings["ready_s"] = time.monotonic() - t0

    def stop(self) -> None:
        """Stops what this lab started; safe to call twice and on a half-started lab."""
        stop_lab(self.root)
        with contextlib.suppress(OSError, ValueError):
            if json.loads(state_file().read_text()).get("root") == str(self.root):
                state_file().unlink()
        shutil.rmtree(self.root, ignore_errors=True)

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return run(self.bin / "kubectl", "--kubeconfig", self.kubeconfig, *args, check=check, timeout=timeout)

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
        run(*ssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", pki / "ca.key", "-out", pki / "ca.crt",
            "-days", "30", "-subj", "/CN=pglab-kube-lab-ca")
        certs = {  # name: (CN, O, SANs)
            "apiserver": ("kube-apiserver", "", f"DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,"
                          f"DNS:kubernetes.default.svc.cluster.local,IP:{API_SERVICE_IP},IP:{NODE_IP},IP:127.0.0.1"),
            "admin": ("kubernetes-admin", "system:masters", ""),
            "apiserver-kubelet-client": ("kube-apiserver-kubelet-client", "system:masters", ""),
            "controller-manager": ("system:kube-controller-manager", "", ""),
            "scheduler": ("system:kube-scheduler", "", ""),
            "kube-proxy": ("system:kube-proxy", "", ""),
            "kubelet": (f"system:node:{NODE}", "system:nodes", f"DNS:{NODE},IP:{NODE_IP}"),
        }
        for name, (cn, org, sans) in certs.items():
            ext = pki / f"{name}.ext"
            ext.write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                           "extendedKeyUsage=clientAuth,serverAuth\n" + (f"subjectAltName={sans}\n" if sans else ""))
            run(*ssl, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", pki / f"{name}.key", "-out",
                pki / f"{name}.csr", "-subj", f"/CN={cn}" + (f"/O={org}" if org else ""))
            run(*ssl, "x509", "-req", "-in", pki / f"{name}.csr", "-CA", pki / "ca.crt", "-CAkey", pki / "ca.key",
                "-CAcreateserial", "-out", pki / f"{name}.crt", "-days", "30", "-extfile", ext)
        run(*ssl, "genrsa", "-out", pki / "sa.key", "2048")
        run(*ssl, "rsa", "-in", pki / "sa.key", "-pubout", "-out", pki / "sa.pub")
        for name, user in (("admin", "admin"), ("controller-manager", "system:kube-controller-manager"),
                           ("scheduler", "system:kube-scheduler"), ("kube-proxy", "system:kube-proxy"),
                           ("kubelet", f"system:node:{NODE}")):
            (self.root / f"{name}.kubeconfig").write_text(json.dumps({
                "apiVersion": "v1", "kind": "Config", "current-context": "pglab-kube-lab",
                "clusters": [{"name": "pglab-kube-lab", "cluster": {
                    "certificate-authority": str(pki / "ca.crt"), "server": f"https://{NODE_IP}:6443"}}],
                "users": [{"name": user, "user": {"client-certificate": str(pki / f"{name}.crt"),
                                                  "client-key": str(pki / f"{name}.key")}}],
                "contexts": [{"name": "pglab-kube-lab", "context": {"cluster": "pglab-kube-lab", "user": user}}],
            }, indent=1))

    def _configs(self) -> None:
        r = self.root
        for d in ("etc/cni", "var", "run", "log", "pv"):
            (r / d).mkdir(parents=True, exist_ok=True)
        (r / "lab.json").write_text(json.dumps({"bin": str(self.bin), "images": str(self.images)}))
        (r / "pv").chmod(0o755)
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
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]],
                          "routes": [{"dst": "0.0.0.0/0"}], "dataDir": f"{r}/var/cni"}},
                {"type": "portmap", "capabilities": {"portMappings": True}}]}))
        (r / "etc/resolv.conf").write_text("search cluster.local\n")  # no nameserver: nothing reaches the host's
        (r / "etc/kubelet.yaml").write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs", "failCgroupV1": False, "address": NODE_IP, "healthzBindAddress": "127.0.0.1",
            "containerRuntimeEndpoint": f"unix://{r}/run/containerd.sock",
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": f"{r}/pki/ca.crt"}},
            "authorization": {"mode": "Webhook"}, "clusterDomain": "cluster.local", "clusterDNS": [DNS_IP],
            "resolvConf": f"{r}/etc/resolv.conf", "tlsCertFile": f"{r}/pki/kubelet.crt",
            "tlsPrivateKeyFile": f"{r}/pki/kubelet.key", "failSwapOn": False,
            "imageGCHighThresholdPercent": 99, "imageGCLowThresholdPercent": 98,
            "evictionHard": {"memory.available": "200Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "maxPods": 60, "serializeImagePulls": False}))

    def _network(self) -> None:
        run("ip", "link", "add", LINK, "type", "bridge")  # a bridge with no port: an address of this machine only
        run("ip", "addr", "add", f"{NODE_IP}/32", "dev", LINK)
        run("ip", "link", "set", LINK, "up")
        if shutil.which("modprobe"):
            run("modprobe", "br_netfilter", check=False)
        run("sysctl", "-qw", "net.ipv4.ip_forward=1", "net.bridge.bridge-nf-call-iptables=1", check=False)
        # Pods may talk to each other (through Services too) and to this machine; nothing they send is forwarded
        # anywhere else.
        run("iptables", "-I", "FORWARD", "1", "-s", POD_CIDR, "!", "-o", "cni0", "-j", "DROP",
            "-m", "comment", "--comment", "pglab-kube-lab")

    def _spawn(self, name: str, *cmd: str | Path, env: dict[str, str] | None = None) -> None:
        log = open(self.root / "log" / f"{name}.log", "ab")  # noqa: SIM115 - the child keeps it
        proc = subprocess.Popen([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=self.root, env={**os.environ, **(env or {})})
        log.close()
        self._pids[name] = proc.pid
        (self.root / "pids.json").write_text(json.dumps(
            {n: [p, start_time(p)] for n, p in self._pids.items()}))

    def _wait(self, name: str, what: str, probe: Any, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if probe():
                    return
            pid = self._pids.get(name)
            if pid is not None and start_time(pid) is None:
                raise LabError(f"{name} exited while the lab started: {self._log_tail(name)}")
            time.sleep(0.3)
        raise LabError(f"{name} was not {what} after {timeout:.0f} s: {self._log_tail(name)}")

    def _log_tail(self, name: str) -> str:
        with contextlib.suppress(OSError):
            lines = (self.root / "log" / f"{name}.log").read_text(errors="replace").strip().splitlines()
            return " | ".join(lines[-3:])[-600:]
        return "(no log)"

    def _start_processes(self) -> None:
        r, b, pki = self.root, self.bin, self.root / "pki"
        self._spawn("etcd", b / "etcd", "--name", "lab", "--data-dir", r / "var/etcd",
                    "--listen-client-urls", "http://127.0.0.1:22379", "--advertise-client-urls",
                    "http://127.0.0.1:22379", "--listen-peer-urls", "http://127.0.0.1:22380",
                    "--initial-advertise-peer-urls", "http://127.0.0.1:22380",
                    "--initial-cluster", "lab=http://127.0.0.1:22380", "--listen-metrics-urls",
                    "http://127.0.0.1:22381", "--quota-backend-bytes", "2147483648", "--unsafe-no-fsync")
        # Every image is imported at start, so a pull is a mistake (a misspelt name) and must not leave the machine:
        # containerd's registry requests all go to a proxy on a closed local port, and fail at once.
        closed = "http://127.0.0.1:9"
        self._spawn("containerd", "containerd", "--config", r / "etc/containerd.toml",
                    env={"HTTP_PROXY": closed, "HTTPS_PROXY": closed, "NO_PROXY": "", "http_proxy": closed,
                         "https_proxy": closed, "no_proxy": ""})
        self._wait("etcd", "healthy", lambda: run("curl", "-sf", "http://127.0.0.1:22381/health", check=False,
                                                  timeout=5).returncode == 0)
        self._spawn("kube-apiserver", b / "kube-apiserver", "--etcd-servers=http://127.0.0.1:22379",
                    f"--bind-address={NODE_IP}", f"--advertise-address={NODE_IP}", "--secure-port=6443",
                    f"--service-cluster-ip-range={SERVICE_CIDR}", f"--client-ca-file={pki}/ca.crt",
                    f"--tls-cert-file={pki}/apiserver.crt", f"--tls-private-key-file={pki}/apiserver.key",
                    f"--kubelet-client-certificate={pki}/apiserver-kubelet-client.crt",
                    f"--kubelet-client-key={pki}/apiserver-kubelet-client.key",
                    f"--service-account-key-file={pki}/sa.pub", f"--service-account-signing-key-file={pki}/sa.key",
                    "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                    "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
                    "--kubelet-preferred-address-types=InternalIP",  # the node name is in no DNS
                    "--allow-privileged=true", "--profiling=false", "--event-ttl=30m")
        self._wait("kube-apiserver", "ready", lambda: run(
            "curl", "-sf", "--cacert", pki / "ca.crt", "--cert", pki / "admin.crt", "--key", pki / "admin.key",
            f"https://{NODE_IP}:6443/readyz", check=False, timeout=5).returncode == 0)
        self._spawn("kube-controller-manager", b / "kube-controller-manager",
                    f"--kubeconfig={r}/controller-manager.kubeconfig",
                    f"--authentication-kubeconfig={r}/controller-manager.kubeconfig",
                    f"--authorization-kubeconfig={r}/controller-manager.kubeconfig", "--bind-address=127.0.0.1",
                    "--leader-elect=false", "--use-service-account-credentials=true",
                    f"--cluster-signing-cert-file={pki}/ca.crt", f"--cluster-signing-key-file={pki}/ca.key",
                    f"--root-ca-file={pki}/ca.crt", f"--service-account-private-key-file={pki}/sa.key",
                    f"--service-cluster-ip-range={SERVICE_CIDR}", "--profiling=false")
        self._spawn("kube-scheduler", b / "kube-scheduler", f"--kubeconfig={r}/scheduler.kubeconfig",
                    f"--authentication-kubeconfig={r}/scheduler.kubeconfig",
                    f"--authorization-kubeconfig={r}/scheduler.kubeconfig", "--bind-address=127.0.0.1",
                    "--leader-elect=false", "--profiling=false")
        sock = r / "run/containerd.sock"
        self._wait("containerd", "serving", sock.exists)
        t0 = time.monotonic()
        for tar in sorted(self.images.glob("*.tar")):
            run("ctr", "-a", sock, "-n", "k8s.io", "images", "import", "--no-unpack=false", tar, timeout=600)
        self.timings["image_import_s"] = time.monotonic() - t0
        self._spawn("kubelet", b / "kubelet", f"--config={r}/etc/kubelet.yaml", f"--kubeconfig={r}/kubelet.kubeconfig",
                    f"--hostname-override={NODE}", f"--node-ip={NODE_IP}", f"--root-dir={r}/var/kubelet",
                    f"--cert-dir={r}/var/kubelet-pki", f"--containerd={sock}", "--v=1",
                    # cAdvisor reads the containers' cgroups every 2 s (default 10 s): a 10 s run's container CPU
                    # from /metrics/cadvisor then has samples inside its window (tests/test_kube_lab_scale.py)
                    f"--housekeeping-interval={HOUSEKEEPING_S}s")
        self._spawn("kube-proxy", b / "kube-proxy", f"--kubeconfig={r}/kube-proxy.kubeconfig",
                    f"--hostname-override={NODE}", "--proxy-mode=iptables", f"--cluster-cidr={POD_CIDR}",
                    "--conntrack-max-per-core=0", "--bind-address=127.0.0.1",
                    "--metrics-bind-address=127.0.0.1:10249", "--healthz-bind-address=127.0.0.1:10256")
        self._spawn("hostpath-provisioner", b / "hostpath-provisioner", f"--kubeconfig={self.kubeconfig}",
                    f"--root={r}/pv")
        self._wait("kubelet", "registered and Ready", self._node_ready)

    def _node_ready(self) -> bool:
        node = json.loads(self.kubectl("get", "node", NODE, "-o", "json", timeout=10).stdout)
        return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])

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


def stop_lab(root: Path) -> None:
    """Stops a lab's processes (by the pids it recorded), its containers and their shims, unmounts what its
    kubelet and containerd mounted, and removes its network device and rules. Runs whatever state it finds."""
    pids: dict[str, list[Any]] = {}
    with contextlib.suppress(OSError, ValueError):
        pids = json.loads((root / "pids.json").read_text())

    def alive(name: str) -> int | None:
        pid, started = pids.get(name, [None, None])
        return pid if pid is not None and start_time(pid) == started else None

    def kill(names: tuple[str, ...], sig: int, wait: float) -> None:
        found = [p for n in names if (p := alive(n)) is not None]
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(start_time(p) is not None for p in found):
            time.sleep(0.1)

    kill(STOP_ORDER, signal.SIGTERM, 10)
    kill(STOP_ORDER, signal.SIGKILL, 5)
    sock = root / "run/containerd.sock"
    if alive("containerd") and sock.exists():
        tasks = run("ctr", "-a", sock, "-n", "k8s.io", "tasks", "ls", "-q", check=False, timeout=20).stdout.split()
        for task in tasks:
            run("ctr", "-a", sock, "-n", "k8s.io", "tasks", "kill", "-s", "KILL", task, check=False, timeout=20)
    kill(("containerd", "etcd"), signal.SIGTERM, 10)
    kill(("containerd", "etcd"), signal.SIGKILL, 5)
    # containerd's shims (and the containers under them) outlive containerd: find them by the lab's folder.
    for _ in range(3):
        left = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _mentions(p, str(root))
                and int(p.name) != os.getpid()]
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if not left:
            break
        time.sleep(0.5)
    for mount in sorted((line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                         if line.split()[1].startswith(str(root) + "/")), reverse=True):
        run("umount", "-l", mount, check=False)
    _iptables_cleanup(root)
    run("ip", "link", "del", LINK, check=False)
    run("ip", "link", "del", "cni0", check=False)
    with contextlib.suppress(OSError):
        (root / "pids.json").unlink()


def _iptables_cleanup(root: Path) -> None:
    while run("iptables", "-D", "FORWARD", "-s", POD_CIDR, "!", "-o", "cni0", "-j", "DROP", "-m", "comment",
              "--comment", "pglab-kube-lab", check=False).returncode == 0:
        pass
    # the kubelet's own chains (KUBE-FIREWALL guards 127.0.0.0/8, the canaries watch for flushes)
    for table in ("filter", "nat", "mangle"):
        rules = run("iptables", "-t", table, "-S", check=False).stdout.splitlines()
        for rule in rules:
            if rule.startswith("-A ") and any(f"-j {c}" in rule for c in KUBELET_CHAINS):
                run("iptables", "-t", table, *rule.replace("-A ", "-D ", 1).split(), check=False)
        for chain in KUBELET_CHAINS:
            if f"-N {chain}" in rules:
                run("iptables", "-t", table, "-F", chain, check=False)
                run("iptables", "-t", table, "-X", chain, check=False)
    with contextlib.suppress(OSError, ValueError, KeyError):  # kube-proxy's KUBE-* chains and rules
        run(Path(json.loads((root / "lab.json").read_text())["bin"]) / "kube-proxy", "--cleanup", check=False)


def _mentions(proc: Path, text: str) -> bool:
    try:
        return text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False


def _running(root: Path) -> bool:
    """Whether any process the lab in ``root`` started is still alive."""
    with contextlib.suppress(OSError, ValueError):
        return any(start_time(pid) == started for pid, started in json.loads((root / "pids.json").read_text()).values())
    return False


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a lab and leave it running until 'down'")
    up.add_argument("--images", type=Path, help="images folder of a build (default: the newest)")
    sub.add_parser("down", help="stop the running lab")
    sub.add_parser("clean", help="stop a lab whose owner (a test run) is gone")
    args = parser.parse_args()
    try:
        if args.cmd == "up":
            lab = KubeLab(args.images)
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
            print(f"Kubernetes lab ready in {lab.timings['ready_s']:.0f} s; images: "
                  f"{', '.join(sorted(set(lab.image_names.values())))}")
            print(f"export KUBECONFIG={lab.kubeconfig}")
        elif args.cmd == "down":
            try:
                root = Path(json.loads(state_file().read_text())["root"])
            except (OSError, ValueError, KeyError):
                print("no Kubernetes lab is running")
                return
            stop_lab(root)
            shutil.rmtree(root, ignore_errors=True)
            state_file().unlink(missing_ok=True)
            print(f"stopped and removed {root}")
        else:
            print(clean_orphan() or "no Kubernetes lab left behind")
    except LabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
