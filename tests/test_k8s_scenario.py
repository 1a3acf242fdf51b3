"""The failover scenario on Kubernetes, against the fake API server: the primary pod deleted during the run, the
operator's promotion followed, the witness pod's log evaluated with the local witness's rules, the scenarios table.

The pods' logs are generated here around the run Job's creation time: pgbench ran in two segments (the fault ended
the first), and the witness wrote acked ids, lost one COMMIT in flight (in doubt), failed through the outage (the
write gap) and wrote again on the new primary; its read-back lacks the last two acks before the fault."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import ClassVar

import pytest
from kubernetes import client

from conftest import CHECKER, pglab
from k8s_fake import FakeAPI, results_log
from k8s_support import JOBS, PGBENCH, assert_all_deleted, check, k8s_plan, posted_jobs, run
from pglab.plan.load import parse_plan
from pglab.report.scenarios import scenario_table
from pglab.store.sqlite import Store
from pglab.targets.kubernetes.orchestrate import FENCED, K8sError
from pglab.targets.kubernetes.render import START_MARK, WITNESS_MARK, render, witness_script
from pglab.targets.kubernetes.scenario import WitnessLogError, parse_witness_log

PLAN = k8s_plan("matrix: {clients: [2], jobs: [1], scenario: [{kind: failover, at: 1s}]}", "run: {duration: 4s}")
RUN, WITNESS = "pg-run-0000-1", "pg-witness-0000-1"
FAULT_AT = 1.0  # the plan's 'at'
LOST = 2  # acks just before the fault that the new primary does not have
OLD, NEW = "10.244.0.11:5432", "10.244.0.12:5432"


class Story:
    """The logs of one failover run, placed around ``t0``: when the run Job started pgbench."""

    extra: ClassVar[dict[str, str]] = {}  # more files the run Job ships (a test's own)

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.attempts: list[tuple[str, int, float, float, str, str, str]] = []
        ident = 0
        t = t0 - 0.2
        while t + 0.005 < t0 + FAULT_AT - 0.01:  # acks on the old primary until just before the fault
            ident += 1
            self.attempts.append(("acked", ident, t, t + 0.005, OLD, f"0/{0x3000000 + ident * 0x100:X}", ""))
            t += 0.01
        self.lost = [a[1] for a in self.attempts[-LOST:]]
        self.last_ack_before = self.attempts[-1][3]
        ident += 1  # its COMMIT in flight when the pod went: in doubt (and it did survive)
        self.in_doubt = ident
        self.attempts.append(("in_doubt", ident, t, t0 + FAULT_AT + 0.3, OLD, f"0/{0x3000000 + ident * 0x100:X}",
                              "psql: error: server closed the connection unexpectedly"))
        self.failed = []
        t = t0 + FAULT_AT + 0.5
        while t < t0 + 2.4:  # the outage: no primary behind pg-rw
            ident += 1
            self.failed.append(ident)
            self.attempts.append(("failed", ident, t, t + 0.01, "-", "-",
                                  'psql: error: connection to server at "pg-rw" (10.96.0.10), port 5432 failed'))
            t += 0.2
        t = t0 + 2.5
        self.first_ack_after = t + 0.005
        while t < t0 + 4.5:  # the new primary
            ident += 1
            self.attempts.append(("acked", ident, t, t + 0.005, NEW, f"0/{0x4000000 + ident * 0x100:X}", ""))
            t += 0.01
        self.acked = [a[1] for a in self.attempts if a[0] == "acked"]
        self.present = sorted({*self.acked, self.in_doubt} - set(self.lost))
        # pgbench's per-transaction log: client 0, every 10 ms, 2 ms each; segment 1 until the fault, 2 after
        self.txn = {"pgbench.101": self._txns(t0, t0 + FAULT_AT), "pgbench.202": self._txns(t0 + 2.5, t0 + 4.0)}

    @staticmethod
    def _txns(start: float, stop: float) -> list[float]:
        out, t = [], start + 0.002
        while t < stop:
            out.append(round(t, 6))
            t += 0.01
        return out

    def witness_log(self) -> str:
        lines = [f"{WITNESS_MARK} {what} {i} {a:.6f} {b:.6f} {srv} {lsn} {err}".rstrip()
                 for what, i, a, b, srv, lsn, err in self.attempts]
        lines += [f"{WITNESS_MARK} stopped {self.attempts[-1][1]}", f"{WITNESS_MARK} walfile 000000020000000000000004",
                  f"{WITNESS_MARK} present begin", *map(str, self.present), f"{WITNESS_MARK} present end"]
        return "\n".join(lines) + "\n"

    def run_log(self) -> str:
        out = (PGBENCH / "pgbench.out").read_text()
        aborted = ("pgbench: error: client 0 aborted in command 4 (SQL) of script 0; perhaps the backend died while "
                   "processing\npgbench: error: client 1 aborted in command 4 (SQL) of script 0; perhaps the backend "
                   "died while processing\n")
        files = {"pgbench.out": out, "pgbench.err": aborted, "pgbench-2.out": out, "pgbench-2.err": "",
                 "reset.log": "TRUNCATE TABLE\nVACUUM\n"}
        for name, ends in self.txn.items():
            files[name] = "".join(f"0 {n} 2000 0 {int(e)} {round((e - int(e)) * 1e6)}\n" for n, e in enumerate(ends))
        return results_log({**files, **self.extra}, text=f"{START_MARK} {self.t0:.6f}\n")


@pytest.fixture
def fake(k8s_api: tuple[FakeAPI, client.ApiClient]) -> tuple[FakeAPI, client.ApiClient]:
    """The fake whose run and witness Jobs print one failover's ``Story``, told from when the run Job started."""
    api, _ = k8s_api
    stories: dict[str, Story] = {}

    def story() -> Story:
        if "s" not in stories:
            stories["s"] = Story(api.job_created_at[RUN])
        return stories["s"]

    def log(job: str) -> str:
        if job == RUN:
            return story().run_log()
        if job == WITNESS:
            return story().witness_log()
        return results_log({"init.log": "done\n"}, text="done\n")

    api.default_log = log
    api.job_seconds = 1.6  # the run Job is still running when the fault is due
    api.story = story  # type: ignore[attr-defined]
    return k8s_api


def run_events(store: Store, run_id: str) -> dict[str, tuple[float, str]]:
    return {kind: (ts, detail) for kind, ts, detail in store.conn.execute(
        "SELECT kind, ts, detail FROM events WHERE run_id = ?", (run_id,))}


def test_failover_deletes_the_primary_pod_and_stores_rto_rpo_and_events(fake: tuple[FakeAPI, client.ApiClient],
                                                                        tmp_path: Path) -> None:
    api, api_client = fake
    api.log_not_ready[RUN] = 3  # the run pod's container is still starting at the first looks
    api.witness_margin_s = 20.0  # the witness writes its margin out unless pglab tells it that pgbench ended
    result = run(api_client, tmp_path, PLAN)
    assert (result.ok, result.failed) == (1, 0), result.failures
    # told once, after the run's Job was seen ended
    run_read_ended = max(i for i, (verb, path) in enumerate(api.requests)
                         if verb == "GET" and path == f"/apis/batch/v1/namespaces/bench/jobs/{RUN}")
    told = [i for i, (verb, path) in enumerate(api.requests) if path.endswith(f"/pods/{WITNESS}-pod/exec")]
    assert [job for job, _ in api.witness_told] == [WITNESS] and len(told) == 1 and told[0] > run_read_ended
    assert api.log_not_ready[RUN] == 0
    story: Story = api.story()  # type: ignore[attr-defined]
    assert posted_jobs(api) == ["pg-pgbench-init", WITNESS, RUN]  # the witness writes before pgbench starts
    # the dataset was loaded in a client pod; scenario runs are Jobs, so it went before they started
    client_gone = api.requests.index(("DELETE", "/api/v1/namespaces/bench/pods/pg-clients-0"))
    assert client_gone < min(i for i, n in api.job_posts if n in (WITNESS, RUN))
    assert [pod for pod, _ in api.deleted_pods] == ["pg-1"]  # the primary, once
    assert api.pod_delete_queries == [{"gracePeriodSeconds": ["1"]}]  # killed, not a smart shutdown
    assert api.primary == "pg-2"

    store = Store.open(tmp_path / "results", create=False)
    (r,) = store.runs()
    events = {kind: (ts, detail) for kind, ts, detail in store.conn.execute(
        "SELECT kind, ts, detail FROM events WHERE run_id = ?", (r.id,))}
    fault, new_primary = events["fault"][0], events["new-primary"][0]
    assert events["fault"][1] == "pod/pg-1 (the primary) deleted"
    assert fault == pytest.approx(api.deleted_pods[0][1], abs=0.05)
    assert fault >= story.t0 + FAULT_AT  # due 'at' seconds after the window start (no warm-up)
    assert events["new-primary"][1].startswith("pg-2 reported primary")
    assert fault < new_primary <= events["cluster-healthy"][0]
    m = r.metrics
    assert m["recovered_s"] == pytest.approx(new_primary - fault)
    assert m["leader_changed"] == 1.0
    assert m["fault_at_s"] == pytest.approx(fault - events["window-start"][0])

    # the witness: acked ids missing from the read-back are lost; the in-doubt id that survived is not
    assert m["acked_lost"] == LOST
    assert m["in_doubt"] == 1 and m["in_doubt_survived"] == 1
    assert m["witness_acked"] == len(story.acked) and m["witness_failed"] == len(story.failed)
    assert m["witness_attempts"] == len(story.attempts) and m["witness_unexpected"] == 0
    assert m["rto_s"] == pytest.approx(story.first_ack_after - fault)  # first ack after the fault, client's view
    assert m["write_gap_s"] == pytest.approx(story.first_ack_after - story.last_ack_before)
    assert m["lsn_gap_bytes"] == LOST * 0x100  # the lost acks' WAL past the last surviving ack on the old primary
    witness = json.loads((store.dir / r.dir / "witness.json").read_text())
    assert (witness["acked_lost_ids"], witness["in_doubt_survived"]) == (story.lost, [story.in_doubt])
    assert witness["timeline"] == 2 and witness["server_after"] == NEW

    # the load through the fault: two pgbench segments, the aborted clients counted, phases from the -l log
    assert m["pgbench_starts"] == 2 and m["clients_aborted"] == 2
    ends = [e for ends in story.txn.values() for e in ends]
    window_start = events["window-start"][0]
    before = [e for e in ends if window_start <= e < fault]
    assert m["tps_before"] == pytest.approx(len(before) / (fault - window_start))
    assert m["transactions"] == len(ends)

    columns, rows = scenario_table(store)
    store.close()
    assert {"rto_max_s", "write_gap_max_s", "acked_lost_total", "in_doubt", "tps_before"} <= set(columns)
    (row,) = rows
    assert (row["scenario"], row["trials"], row["acked_lost_total"], row["in_doubt"]) == ("failover-node", 1, LOST, 1)
    assert row["rto_max_s"] == pytest.approx(m["rto_s"])
    proc = pglab("report", str(tmp_path / "results"), "--table", "scenarios", "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    assert "failover-node" in proc.stdout and "acked" in proc.stdout.splitlines()[0]
    assert_all_deleted(api)


def test_a_failover_that_never_completes_fails_the_run_and_cleans_up(fake: tuple[FakeAPI, client.ApiClient],
                                                                     tmp_path: Path) -> None:
    api, api_client = fake
    api.never_promote = True
    result = run(api_client, tmp_path, PLAN, scenario_timeout_s=0.5)
    assert (result.ok, result.failed) == (0, 1)
    reason = ("failover: no new primary reported 0 s after pod/pg-1 was deleted (currentPrimary pg-1, targetPrimary "
              "pending, phase: Failing over, ready instances: 1 of 2); Cluster/pg not healthy (phase: Failing over, "
              "ready instances: 1 of 2)")
    assert result.failures == [f"tpcb-like sc=on c=2 j=1 scenario=failover-node #1: {reason}"]
    store = Store.open(tmp_path / "results", create=False)
    (r,) = store.runs()
    assert (r.status, r.reason) == ("failed", reason)
    kinds = [k for (k,) in store.conn.execute("SELECT kind FROM events WHERE sweep_id = 1 AND kind = 'fault'")]
    assert kinds == ["fault"]
    store.close()
    assert ("DELETE", f"{JOBS}/{WITNESS}") in api.requests
    assert_all_deleted(api)


def test_witness_log_without_its_read_back_is_refused() -> None:
    story = Story(1_000_000.0)
    text = story.witness_log()
    log = parse_witness_log(text)
    assert log.present == story.present and log.timeline == 2
    assert [a.id for a in log.attempts if a.outcome == "in_doubt"] == [story.in_doubt]
    with pytest.raises(WitnessLogError, match="ends before the ids it read back"):
        parse_witness_log(text.split(f"{WITNESS_MARK} present begin")[0])
    with pytest.raises(WitnessLogError, match=r"could not read its table: psql: error: no primary"):
        parse_witness_log(f"{WITNESS_MARK} read-failed psql: error: no primary\n")


def test_render_writes_the_witness_job_beside_each_failover_run(tmp_path: Path) -> None:
    (tmp_path / "plan.yaml").write_text(PLAN)
    out = tmp_path / "m"
    pglab("k8s", "render", str(tmp_path / "plan.yaml"), "-o", str(out), check=True)
    assert (out / "jobs" / "50-witness-0000-1-job.yaml").is_file()
    proc = check(CHECKER, *sorted(out.glob("*/*.yaml")))  # strictly decoded as the API server would
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = parse_plan(PLAN, base_dir=tmp_path)
    jobs = [m for m in render(plan, tmp_path) if m.kind == "Job"]
    assert [m.name for m in jobs] == ["pg-pgbench-init", WITNESS, RUN]
    pod = jobs[1].body["spec"]["template"]["spec"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["PGHOST"]["value"] == "pg-rw"
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "pg-app", "key": "password"}
    script = pod["containers"][0]["command"][2]
    assert script == witness_script(plan, 4.0) and "INSERT INTO pglab_witness" in script
    run_script = jobs[2].body["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert START_MARK in run_script and '-T "$left"' in run_script


@pytest.mark.parametrize(("scenario", "message"), [
    ("{kind: failover, kill: postgres}",
     "matrix.scenario[0].kill: on Kubernetes a failover deletes the primary pod (kill: node); kill: postgres is not "
     "available there"),
    ("{kind: backup}", "matrix.scenario[0].kind: a backup on Kubernetes needs target.kubernetes.wal_archive (the "
     "object store the Barman Cloud plugin archives WAL and writes the base backup to)"),
    ("{kind: standby-loss, down: 1s}", "matrix.scenario[0].kind: a standby-loss needs a standby: raise "
     "target.kubernetes.instances"),
    ("{kind: node-loss}", "matrix.scenario[0].kind: a node-loss needs target.kubernetes.node_fault: the commands "
     "that stop and start a node (Kubernetes cannot power a machine off)"),
])
def test_plan_refuses_other_scenarios_on_kubernetes(tmp_path: Path, scenario: str, message: str) -> None:
    path = tmp_path / "plan.yaml"
    text = PLAN.replace("{kind: failover, at: 1s}", scenario)
    path.write_text(text.replace("instances: 2", "instances: 1") if "standby" in scenario else text)
    proc = pglab("plan", "validate", str(path))
    assert proc.returncode == 2, proc.stdout
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_node_kinds_are_refused_on_a_local_target(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text("name: t\nmatrix: {clients: [1], scenario: [{kind: node-drain}]}\nrun: {duration: 10s}\n")
    proc = pglab("plan", "validate", str(path))
    assert proc.returncode == 2, proc.stdout
    assert proc.stderr.strip() == ("matrix.scenario[0].kind: node-drain runs on a Kubernetes target only (the "
                                   "local lab's failover with kill: node is its node loss)"), proc.stderr


# ------------------------------------------------------------------ switchover and standby-loss
def test_switchover_asks_the_operator_to_promote_a_standby_and_stores_its_time(
        fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path) -> None:
    api, api_client = fake
    text = PLAN.replace("{kind: failover, at: 1s}", "{kind: switchover, at: 1s, witness: false}")
    api.status_conflicts = 1  # the operator wrote the status between pglab's read and its patch: asked again
    result = run(api_client, tmp_path, text)
    assert (result.ok, result.failed) == (1, 0), result.failures
    assert api.deleted_pods == [] and api.primary == "pg-2"  # asked, not killed
    refused, patch = api.status_patches  # on the status subresource, as kubectl cnpg promote writes it
    assert refused["status"]["targetPrimary"] == "pg-2"
    # under the version read: the stale one refused (the operator had written since), the fresh one applied
    assert int(patch["metadata"]["resourceVersion"]) == int(refused["metadata"]["resourceVersion"]) + 1
    status = patch["status"]
    assert (status["targetPrimary"], status["phase"], status["phaseReason"]) == (
        "pg-2", "Switchover in progress", "Switching over to pg-2")
    assert datetime.strptime(status["targetPrimaryTimestamp"], "%Y-%m-%dT%H:%M:%S.%fZ")  # Go's RFC3339Micro, UTC
    store = Store.open(tmp_path / "results", create=False)
    (r,) = store.runs()
    events = run_events(store, r.id)
    assert events["fault"][1] == "switchover from pg-1 to pg-2 requested"
    fault, new_primary = events["fault"][0], events["new-primary"][0]
    assert fault < new_primary <= events["cluster-healthy"][0]
    assert r.metrics["recovered_s"] == pytest.approx(new_primary - fault) and r.metrics["leader_changed"] == 1.0
    assert "witness_acked" not in r.metrics  # witness: false
    _, rows = scenario_table(store)
    store.close()
    assert [row["scenario"] for row in rows] == ["switchover"]
    assert_all_deleted(api)


STANDBY_LOSS = PLAN.replace("{kind: failover, at: 1s}", "{kind: standby-loss, at: 1s, down: 1s, witness: false}")


def test_standby_loss_fences_a_standby_for_down_seconds(fake: tuple[FakeAPI, client.ApiClient],
                                                        tmp_path: Path) -> None:
    api, api_client = fake
    api.unfence_reads = 3  # its postgres takes a while to be ready again: the run waits for it
    result = run(api_client, tmp_path, STANDBY_LOSS)
    assert (result.ok, result.failed) == (1, 0), result.failures
    assert api.deleted_pods == [] and api.primary == "pg-1" and api.status_patches == []
    assert api.patches == [{"metadata": {"annotations": {FENCED: '["pg-2"]'}}},  # the standby, not the primary
                           {"metadata": {"annotations": {FENCED: None}}}]  # and the fence lifted
    assert api.fenced_reads[-1] == []
    store = Store.open(tmp_path / "results", create=False)
    (r,) = store.runs()
    events = run_events(store, r.id)
    fault, back = events["fault"][0], events["standby-back"][0]
    assert events["fault"][1].startswith("standby pg-2 fenced")
    assert back - fault >= 1.0  # 'down'
    healthy = events["cluster-healthy"][0]
    assert back <= healthy
    assert [n for t, n in api.ready_reads if back < t < healthy] == [1, 1, 1, 2]  # not ready yet: waited for
    assert r.metrics["recovered_s"] == pytest.approx(back - fault) and "leader_changed" not in r.metrics
    store.close()
    assert_all_deleted(api)


def test_a_node_that_cannot_be_brought_back_stops_the_sweep(fake: tuple[FakeAPI, client.ApiClient],
                                                            tmp_path: Path) -> None:
    """node-loss: the plan's stop command gets the primary's node; when the start command fails (after a failover
    that never completed), that is said in one sentence and no further run starts without the node."""
    api, api_client = fake
    api.never_promote = True
    asked = tmp_path / "asked.txt"
    stop = ["sh", "-c", f"echo stop {{node}} >> {asked}"]
    start = ["sh", "-c", f"echo start {{node}} >> {asked}; echo 'no power to {{node}}' >&2; exit 3"]
    text = k8s_plan("matrix: {clients: [2], jobs: [1], scenario: [{kind: node-loss, at: 1s}]}",
                    "run: {duration: 4s, repeats: 2}",
                    kubernetes=(f"node_fault: {{stop: {json.dumps(stop)}, start: {json.dumps(start)}}}",))
    why = ("node node-1 could not be brought back: node-loss: target.kubernetes.node_fault.start for node node-1 "
           "exited 3: no power to node-1")
    # the sweep ends before its second run, with the reason in one sentence (pglab run prints it, exit 1)
    with pytest.raises(K8sError, match=re.escape(f"{why}; the sweep stops (its next runs would miss that node)")):
        run(api_client, tmp_path, text, scenario_timeout_s=0.5)
    assert asked.read_text().splitlines() == ["stop node-1", "start node-1"]  # the primary pg-1's node, once
    store = Store.open(tmp_path / "results", create=False)
    assert [r.status for r in store.runs()] == ["failed"]  # the failover never completed; no second run
    events = dict(store.conn.execute("SELECT kind, detail FROM events"))
    assert events["fault"] == "node node-1 (of the primary pg-1) stopped"
    assert events["node-back-failed"] == why
    store.close()
    assert_all_deleted(api)


def test_a_down_longer_than_the_scenario_timeout_is_waited_for(fake: tuple[FakeAPI, client.ApiClient],
                                                               tmp_path: Path) -> None:
    """The timeout counts from the fence being lifted, not from the fault: 'down' is the plan's to choose."""
    api, api_client = fake
    result = run(api_client, tmp_path, STANDBY_LOSS.replace("down: 1s", "down: 2s"), scenario_timeout_s=0.5)
    assert (result.ok, result.failed) == (1, 0), result.failures
    assert api.fenced_reads[-1] == []


def test_a_run_that_fails_while_a_standby_is_fenced_lifts_the_fence(fake: tuple[FakeAPI, client.ApiClient],
                                                                    tmp_path: Path) -> None:
    api, api_client = fake
    api.hanging_jobs = {RUN}  # the run's Job never ends: it times out while the standby is fenced
    result = run(api_client, tmp_path, STANDBY_LOSS.replace("down: 1s", "down: 2.5s"), job_timeout_s=2.0)
    assert (result.ok, result.failed) == (0, 1)
    assert f"Job/{RUN} still running after 2 s" in result.failures[0]
    assert api.patches == [{"metadata": {"annotations": {FENCED: '["pg-2"]'}}},
                           {"metadata": {"annotations": {FENCED: None}}}]  # lifted before the sweep went on


def test_a_switchover_that_never_completes_fails_the_run(fake: tuple[FakeAPI, client.ApiClient],
                                                         tmp_path: Path) -> None:
    api, api_client = fake
    api.never_promote = True
    text = PLAN.replace("{kind: failover, at: 1s}", "{kind: switchover, at: 1s, witness: false}")
    result = run(api_client, tmp_path, text, scenario_timeout_s=0.3)
    assert (result.ok, result.failed) == (0, 1)
    assert ("switchover: no new primary reported 0 s after the switchover request (currentPrimary pg-1, "
            "targetPrimary pg-2, phase: Switchover in progress") in result.failures[0]
    assert_all_deleted(api)


# ------------------------------------------------------------------ pg_stat_statements through a scenario
STATEMENTS = "postgres:\n  parameters: {pg_stat_statements.max: '1000'}\n"
UPDATE = "UPDATE pgbench_accounts SET abalance = abalance + $1 WHERE aid = $2"


def test_statements_are_read_through_a_standby_loss(fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A standby-loss keeps the primary: its run Job reads pg_stat_statements around pgbench's segments and the run
    keeps statements.json."""
    from k8s_support import statements_read, statements_row
    from pglab.targets.kubernetes.statements import END_FILE, START_FILE

    api, api_client = fake
    monkeypatch.setattr(Story, "extra", {
        "settings.txt": "pg_stat_statements.max|1000||f|t\n",
        START_FILE: statements_read(100.0, [statements_row(16385, 11, UPDATE, 5, 2.0)], 0),
        END_FILE: statements_read(104.0, [statements_row(16385, 11, UPDATE, 305, 92.0)], 0)})
    result = run(api_client, tmp_path, STANDBY_LOSS + STATEMENTS)
    assert (result.ok, result.failed) == (1, 0), result.failures
    (job,) = [b for b in api.posted if b["kind"] == "Job" and b["metadata"]["name"] == RUN]
    script = job["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert script.index(f"statements_read {START_FILE}") < script.index(START_MARK) < script.index(
        f"statements_read {END_FILE}")
    (run_dir,) = (tmp_path / "results" / "runs").iterdir()
    doc = json.loads((run_dir / "statements.json").read_text())
    assert [(s["query"], s["calls"], s["total_exec_time"]) for s in doc["statements"]] == [(UPDATE, 300, 90.0)]


def test_statements_are_not_read_through_a_failover_and_run_json_says_why(
        fake: tuple[FakeAPI, client.ApiClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failover moves -rw to another server: its Job does not read the view, ships why instead (what the fake's
    Job ships is what the rendered script writes), and run.json's statements say it."""
    from pglab.targets.kubernetes.statements import NOT_READ_FILE

    api, api_client = fake
    text = PLAN + STATEMENTS
    why = next(line for line in _run_script(text, tmp_path).splitlines() if NOT_READ_FILE in line)
    reason = why.split("echo ", 1)[1].rsplit(" > ", 1)[0].strip("'")
    assert reason.startswith("not read through a failover: the -rw Service leads to another server")
    monkeypatch.setattr(Story, "extra", {"settings.txt": "pg_stat_statements.max|1000||f|t\n",
                                         NOT_READ_FILE: reason + "\n"})
    result = run(api_client, tmp_path, text)
    assert (result.ok, result.failed) == (1, 0), result.failures
    (job,) = [b for b in api.posted if b["kind"] == "Job" and b["metadata"]["name"] == RUN]
    script = job["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert "statements_read" not in script and why in script
    (run_dir,) = (tmp_path / "results" / "runs").iterdir()
    assert json.loads((run_dir / "run.json").read_text())["statements"] == {"not_read": reason}
    assert not (run_dir / "statements.json").exists()


def _run_script(text: str, tmp_path: Path) -> str:
    (job,) = [m for m in render(parse_plan(text, base_dir=tmp_path), tmp_path)
              if m.body["metadata"]["labels"].get("pglab/component") == "pgbench-run"]
    return str(job.body["spec"]["template"]["spec"]["containers"][0]["command"][2])
