"""The scripts the rendered pods run, as text, and the paths and markers they share with pglab: the results
shipped through the pod's log, the disk sampler's and the volume probe's lines, fio's jobs, the dataset reset, the
wait for a point's parameters, the load pods' barrier, pgbench through a fault, the witness writer, the object
store's listing. ``render`` puts them into the manifests; nothing here knows a manifest."""

from __future__ import annotations

import shlex
from pathlib import Path

from pglab.plan.schema import Plan
from pglab.scenarios import witness
from pglab.workloads import fio
from pglab.workloads.pgbench import init_args

RESULTS_DIR = "/results"
SCRIPTS_DIR = "/scripts"
VOLUME_DIR = "/volume"
BEGIN_MARK = "----- pglab results begin -----"
END_MARK = "----- pglab results end -----"
LOAD_DIR = "load-{index}"  # each load pod's shipped files, under the run's folder
READ_MARK = "pglab-statements"  # in the text of pglab's own statements in a run's window (the reads, the load pods'
# barrier), so that the window's pg_stat_statements leaves them out


STORE_MARK = "pglab-store"  # the listing Job's line: "<mark> <backup objects> <bytes> <WAL objects> <bytes>"
LIST_STORE = f"""
import os, boto3
from urllib.parse import urlparse
u = urlparse(os.environ["DESTINATION"])
base = "/".join(p for p in (u.path.strip("/"), os.environ["SERVER"]) if p)
s3 = boto3.client("s3", endpoint_url=os.environ.get("ENDPOINT") or None)
def total(prefix):
    n = b = 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=u.netloc, Prefix=prefix):
        for o in page.get("Contents", []):
            n, b = n + 1, b + o["Size"]
    return n, b
print("{STORE_MARK}", *total(base + "/base/" + os.environ["BACKUP_ID"] + "/"), *total(base + "/wals/"))
"""


SERVER_WAIT_S = 60  # how long the dataset Job waits for the primary's service to accept connections


def wait_for_server(seconds: int = SERVER_WAIT_S) -> str:
    """Shell that waits until libpq's PGHOST:PGPORT accepts connections (pg_isready, where the image has it), for at
    most ``seconds``, saying so once: a Cluster just made again is healthy before its ``-rw`` Service routes to the
    new primary on every node (a loaded lab's pgbench -i was refused there once), and pgbench -i tries only once."""
    return "\n".join([
        "w=0",
        f"while command -v pg_isready >/dev/null && ! pg_isready -q -t 2 && [ $w -lt {seconds} ]; do",
        f'  [ $w -gt 0 ] || echo "pglab: waiting up to {seconds} s for $PGHOST:$PGPORT to accept connections"',
        "  sleep 1; w=$((w + 1))",
        "done",
        "",
    ])


def ship_results() -> str:
    """Shell that prints RESULTS_DIR as a base64 tarball between markers: pglab reads it from the pod's log."""
    return (f"echo '{BEGIN_MARK}'; tar -C {RESULTS_DIR} -czf - . | base64; echo '{END_MARK}'")


DISKSTATS_MARK = "pglab-diskstats"  # a block of the sampler's log: "<mark> <epoch> <node> <boot id>", the file,
# "<mark> end <epoch>" (the epoch read again once the file was read)


DISK_SAMPLE_S = 0.2  # a window's edges fall inside an interval, pro-rated as if its I/O were even: with 1 s
# intervals a 10 s window of the multi-node lab was 3.4 % off the writes the kernel counted on the node's disk


def disk_sampler_script() -> str:
    """Every DISK_SAMPLE_S: the node's epoch, its name, its kernel's boot id, /proc/diskstats, an end line with the
    epoch again, printed at once (a block cut by the log's end is recognised). The two epochs bound the file's read
    (forking ``cat`` takes its time on a loaded node): the block's time is their middle. /proc/diskstats is not
    namespaced: an unprivileged container reads the host's; the boot id tells nodes that are containers on one
    kernel (kind, k3d) apart from real ones."""
    return "\n".join([
        "trap 'exit 0' TERM",
        "k=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo -)",
        "while :; do",
        "  t=$(date +%s.%N); s=$(cat /proc/diskstats); u=$(date +%s.%N)",
        f'  printf \'%s\\n\' "{DISKSTATS_MARK} $t $NODE_NAME $k" "$s" "{DISKSTATS_MARK} end $u"',
        f"  sleep {DISK_SAMPLE_S:g}",
        "done",
    ])


VOLUME_MARK = "pglab-volume"  # the probe's line: "<mark> <claim> <major:minor> <fstype> <source> <boot id>"


def volume_probe_script(root: str = "/volumes") -> str:
    """For each claim mounted under ``root``: the device number of its mount, its filesystem type and source,
    from the pod's own mountinfo (fields 3 and 5, then what follows " - "). A second mount of a volume shares its
    superblock with the instance's mount, so this is the device number PostgreSQL's files have. The kernel's boot
    id tells nodes that are containers of one host (kind, k3d) apart from real ones."""
    return "\n".join([
        "k=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo -)",
        f"for d in {root}/*; do",
        "  while read -r _id _parent mm _root mp rest; do",
        '    [ "$mp" = "$d" ] || continue',
        '    set -- ${rest#* - }',
        f'    echo "{VOLUME_MARK} ${{d##*/}} $mm $1 $2 $k"',
        "  done < /proc/self/mountinfo",
        "done",
    ])


VOLUME_MOUNT_FILE = "volume-mount.txt"  # the fio Job's /proc/self/mountinfo line of its volume


def fio_script(plan: Plan) -> str:
    """fio's jobs (the storage issue's profiles, same options as on a local lab), one after the other."""
    assert plan.storage is not None
    size = plan.storage.size.bytes
    k8s = plan.target.kubernetes
    assert k8s is not None
    missing = (f"pglab: the image {k8s.clients.fio_image} has no fio; name an image with fio in "
               "target.kubernetes.clients.fio_image (tools/images/Containerfile builds one)")
    lines = ["set -eu", f"command -v fio >/dev/null || {{ echo {shlex.quote(missing)} >&2; exit 3; }}",
             "fio --version > " + RESULTS_DIR + "/fio-version.txt",
             # the volume's mount as the node's kernel gives it (device major:minor, filesystem, source)
             f"grep -F ' {VOLUME_DIR} ' /proc/self/mountinfo > {RESULTS_DIR}/{VOLUME_MOUNT_FILE} || true"]
    for profile in plan.storage.profiles:
        for job in fio.jobs_for(profile):
            cmd = fio._command("fio", job, Path(VOLUME_DIR), Path(RESULTS_DIR), plan.storage.runtime, size, 0.0,
                               builtin=True)
            lines.append(shlex.join(cmd))
    lines.append(f"rm -f {VOLUME_DIR}/{fio.DATA_FILE}")
    lines.append(ship_results())
    return "\n".join(lines)


RESET_SQL = ("TRUNCATE pgbench_history",
             "VACUUM (ANALYZE) pgbench_branches, pgbench_tellers, pgbench_accounts, pgbench_history")
CHECKPOINT_REFUSED = ("pglab: CHECKPOINT failed (the app role lacks pg_checkpoint: PostgreSQL before 15): dirty "
                      "buffers stay")


def reset_script(plan: Plan) -> str:
    """The dataset reset before each run, as on a local lab: 'vacuum' (history truncated, VACUUM ANALYZE, then a
    CHECKPOINT when the role may) or 'reinit' (pgbench -i again). Its output goes to reset.log; a failure fails
    the run (rc set, pgbench not started)."""
    ds = plan.dataset
    if ds.reset == "reinit":
        return f"{shlex.join(['pgbench', *init_args(Path(), ds, client_side=True)[1:]])} > reset.log 2>&1 || rc=$?\n"
    psql = ["psql", "-X", "-v", "ON_ERROR_STOP=1"]
    for stmt in RESET_SQL:
        psql += ["-c", stmt]
    return (f"{shlex.join(psql)} > reset.log 2>&1 || rc=$?\n"
            f"psql -X -c CHECKPOINT >> reset.log 2>&1 || echo {shlex.quote(CHECKPOINT_REFUSED)} >> reset.log\n")


SETTINGS_FILE = "settings.txt"
SETTINGS_WAIT_S = 300  # how long a run's Job waits for its parameters to be in force on the primary
_MEMORY_UNITS = ("B", "kB", "MB", "GB", "TB")
_TIME_UNITS = ("us", "ms", "s", "min", "h", "d")


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def settings_sql(parameters: dict[str, str]) -> str:
    """One row per parameter, ``name|setting|unit|pending_restart|ok``, where PostgreSQL itself says whether the
    value in force is the one asked for: booleans by meaning, sizes through pg_size_bytes, durations as intervals,
    bare numbers in the setting's own unit, anything else as text (case aside)."""
    wanted = ", ".join(f"({_sql_text(k)}, {_sql_text(v)})" for k, v in sorted(parameters.items()))
    # pg_size_bytes spells a byte "bytes" (PostgreSQL 15 refuses "B", which GUCs accept)
    one_unit = "(CASE WHEN s.unit = 'B' THEN '1 bytes' WHEN s.unit ~ '^[0-9]' THEN s.unit ELSE '1' || s.unit END)"
    want_size = "regexp_replace(w.want, '([0-9 ])B$', '\\1 bytes')"
    memory = ", ".join(_sql_text(u) for u in _MEMORY_UNITS)
    times = ", ".join(_sql_text(u) for u in _TIME_UNITS)
    ok = (
        "CASE WHEN s.name IS NULL THEN false "
        "WHEN s.vartype = 'bool' THEN s.setting = CASE WHEN lower(w.want) IN ('on', 'true', 'yes', '1') THEN 'on' "
        "WHEN lower(w.want) IN ('off', 'false', 'no', '0') THEN 'off' END "
        "WHEN s.vartype IN ('integer', 'real') AND w.want ~ '^\\s*-?[0-9.]+([eE][-+]?[0-9]+)?\\s*$' "
        "THEN abs(s.setting::numeric - w.want::numeric) < (CASE s.vartype WHEN 'integer' THEN 0.5 ELSE 1e-9 END) "
        # each conversion's WHEN also tests the wanted text alone: folded to false for a single parameter (its
        # VALUES row becomes constants), the branch is dropped before PostgreSQL would try pg_size_bytes('off')
        f"WHEN w.want ~ '^\\s*[0-9.]+\\s*({'|'.join(_MEMORY_UNITS)})\\s*$' "
        f"AND regexp_replace(s.unit, '^[0-9]+', '') IN ({memory}) THEN abs(s.setting::numeric * "
        f"pg_size_bytes({one_unit}) - pg_size_bytes({want_size})) < pg_size_bytes({one_unit}) "
        f"WHEN w.want ~ '^\\s*[0-9.]+\\s*({'|'.join(_TIME_UNITS)})\\s*$' AND s.unit IN ({times}) "
        "THEN abs(extract(epoch FROM (s.setting || ' ' || s.unit)::interval) - "
        f"extract(epoch FROM w.want::interval)) < extract(epoch FROM ('1 ' || s.unit)::interval) "
        "ELSE lower(s.setting) = lower(w.want) END")
    return (f"SELECT w.name, s.setting, coalesce(s.unit, ''), s.pending_restart, {ok} "
            f"FROM (VALUES {wanted}) AS w(name, want) LEFT JOIN pg_settings s USING (name) ORDER BY w.name")


def settings_script(parameters: dict[str, str]) -> str:
    """Wait (at most SETTINGS_WAIT_S) until the primary runs with the point's parameters and none waits for a
    restart, retrying through a rolling restart; then ship what was found. Not applied in time: no pgbench, exit 3
    (the sweep names the parameter from settings.txt)."""
    if not parameters:
        return ""
    query = shlex.join(["psql", "-XAtq", "-F", "|", "-c", settings_sql(parameters)])
    tries = SETTINGS_WAIT_S // 2
    return (f"n=0\nuntil {query} > {SETTINGS_FILE} 2> settings.err && ! grep -qv '|f|t$' {SETTINGS_FILE}; do\n"
            f"  n=$((n+1)); [ \"$n\" -ge {tries} ] && break; sleep 2\ndone\n"
            f"if ! grep -q . {SETTINGS_FILE} || grep -qv '|f|t$' {SETTINGS_FILE}; then rc=3; fi\n")


LOAD_BARRIER_TABLE = "pglab_load_barrier"  # where the load pods meet before pgbench starts
LOAD_BARRIER_POLL_S = 0.1  # how often a load pod looks whether all have arrived: the start skew's bound
LOAD_FAILED_BARRIER = 4  # a load pod's exit code when the others never arrived


def barrier_script(index: int, pods: int, deadline_s: float) -> str:
    """The load pods start pgbench together: pod 0 (after the settings wait and the dataset reset) and every
    other pod enter a row into a table of the benchmark database, then each waits until all ``pods`` rows of this
    Job (its uid) are there, looking every LOAD_BARRIER_POLL_S. A pod not joined by all within ``deadline_s`` (pod
    0 failed, a pod cannot be scheduled) gives up with LOAD_FAILED_BARRIER; the Job's backoffLimit 0 ends the
    others."""
    table, fail = LOAD_BARRIER_TABLE, LOAD_FAILED_BARRIER
    lines = [f"deadline=$(( $(date +%s) + {round(deadline_s)} ))"]
    if index == 0:  # the table is created by pod 0 only: concurrent CREATE TABLE IF NOT EXISTS can collide
        create = shlex.quote(f"CREATE TABLE IF NOT EXISTS {table} /* {READ_MARK} */ (job text, pod int)")
        lines.append(f'if [ "$rc" = 0 ]; then psql -XAtq -v ON_ERROR_STOP=1 -c {create} >> barrier.log 2>&1 '
                     "|| rc=$?; fi")
    lines += [
        f'if [ "$rc" = 0 ]; then until psql -XAtq -v ON_ERROR_STOP=1 -c "INSERT INTO {table} /* {READ_MARK} */ VALUES '
        f"('$PGLAB_JOB_UID', {index})\" >> barrier.log 2>&1; do",  # pod 0 has not created the table yet
        f'  [ "$(date +%s)" -lt "$deadline" ] || {{ rc={fail}; break; }}; sleep 0.5',
        "done; fi",
        f'if [ "$rc" = 0 ]; then until [ "$(psql -XAtq -c "SELECT count(*) FROM {table} /* {READ_MARK} */ WHERE job = '
        f"'$PGLAB_JOB_UID'\" 2>> barrier.log)\" = {pods} ]; do",
        f'  [ "$(date +%s)" -lt "$deadline" ] || {{ rc={fail}; break; }}; sleep {LOAD_BARRIER_POLL_S:g}',
        "done; fi",
        f'[ "$rc" != {fail} ] || echo "pglab: load pod {index}: the {pods} load pods did not all start within '
        f'{round(deadline_s)} s (see the other pods of this Job)" >&2',
    ]
    return "\n".join(lines) + "\n"


def end_barrier_script(index: int, pods: int, deadline_s: float) -> str:
    """After its pgbench, every load pod enters a row of its own (``<job>-end``) whatever its pgbench did; pod 0 then
    waits (at most ``deadline_s``, and only when its own pgbench ran) until all ``pods`` did, so that what it reads
    next is every pod's window. A pod not done by then leaves pod 0 without its last read (``ended`` 0), not
    failed."""
    table, key = LOAD_BARRIER_TABLE, "'$PGLAB_JOB_UID-end'"
    lines = [f'psql -XAtq -c "INSERT INTO {table} /* {READ_MARK} */ VALUES ({key}, {index})" >> barrier.log 2>&1 '
             "|| true"]
    if index == 0:  # only after its own pgbench ran: a pod 0 that failed before ends at once
        lines += [f'ended=0; if [ "$rc" = 0 ]; then ended=1; deadline=$(( $(date +%s) + {round(deadline_s)} ))',
                  f'until [ "$(psql -XAtq -c "SELECT count(*) FROM {table} /* {READ_MARK} */ WHERE job = {key}" '
                  f'2>> barrier.log)" = {pods} ]; do',
                  f'  [ "$(date +%s)" -lt "$deadline" ] || {{ ended=0; break; }}; sleep {LOAD_BARRIER_POLL_S:g}',
                  "done; fi"]
    return "\n".join(lines) + "\n"


WindowRead = tuple[str, str, str]  # a shell function's definition, and its calls at the window's start and end


def window_reads(reads: list[WindowRead], warmup_s: float) -> tuple[str, str]:
    """The shell before and after a run's ``if [ "$rc" = 0 ]; then <pgbench>; fi`` line that reads ``reads`` (the
    first outermost: its start read first, its end read last) at the measured window's edges: right before pgbench
    starts and right after it ends, or, with a warm-up (pgbench runs it and the window in one process), the start
    reads ``warmup_s`` after pgbench started, in the background (pgbench.err appears as the shell starts it)."""
    if not reads:
        return "", ""
    defs = "".join(f"{d}\n" for d, _, _ in reads)
    starts, ends = "; ".join(s for _, s, _ in reads), "; ".join(e for _, _, e in reversed(reads))
    if warmup_s <= 0:
        return (f'{defs}if [ "$rc" = 0 ]; then {starts}; fi\n', f'if [ "$rc" = 0 ]; then {ends}; fi\n')
    before = (f"{defs}(until [ -e pgbench.err ]; do sleep 0.05; done; sleep {warmup_s:g}; {starts}) &\n"
              "window_reader=$!\n")
    after = (f'if [ "$rc" = 0 ]; then wait "$window_reader" || true; {ends}; '
             'else kill "$window_reader" 2>/dev/null || true; fi\n')
    return before, after


START_WAIT = "pglab: waiting for the common start of every tenant"


def start_wait_script(start_at: int) -> str:
    """Hold the script until ``start_at`` (epoch s), every tenant's pgbench so starting in the same second; a pod
    that is later goes on at once."""
    return (f"echo {shlex.quote(START_WAIT)} {start_at}\nnow=$(date +%s)\n"
            f"if [ \"$now\" -lt {start_at} ]; then sleep $(({start_at} - now)); fi\n")


START_MARK = "pglab: pgbench start"  # the run Job's stdout, with the pod's epoch: the scenario's clock starts there
WITNESS_MARK = "pglab-witness"  # every line of the witness Job's stdout that pglab reads
WITNESS_TABLE = witness.TABLE  # the local witness's table, same columns
# pgbench's dbname argument through a fault, a libpq connection string (PGDATABASE and the rest still apply)
PGBENCH_THROUGH_FAULTS = ("connect_timeout=5 keepalives_idle=2 keepalives_interval=1 keepalives_count=3 "
                          "tcp_user_timeout=5000")
WITNESS_MARGIN_S = 10  # the witness writes this much longer than pgbench (its pod may start a little later)…
WITNESS_STOP = "pgbench-ended"  # …unless pglab makes this file in its RESULTS_DIR once pgbench has ended
WITNESS_OVERTIME_S = 180  # and, while its writes fail, up to this much longer still, until one is acknowledged
WITNESS_READ_TRIES = 90  # read-back tries, 2 s apart: the new primary may still be on its way
WITNESS_ATTEMPT_S = 10  # one attempt's deadline: a COMMIT can wait for a synchronous standby for ever (below)


def segments_script(args: list[str], seconds: float) -> str:
    """pgbench through a fault: started again (new pid, so new -l files) whenever the failover ends it, until the
    run's time is up, as the local runner does. Segment n > 1 writes pgbench-n.out/.err. The Job succeeds when one
    segment at least reported its transactions."""
    at = args.index("-T")
    # the server may vanish without a word (its node lost: no RST, no FIN), a client's query sent and acknowledged:
    # with keepalives after 2 s of silence and a deadline on what goes unanswered, each pgbench client errs out
    # within seconds and the next segment connects to the new primary, instead of waiting for ever (libpq's
    # keepalives otherwise start after the kernel's 2 h); a server that is only slow still answers keepalives
    cmd = shlex.join(args[:at + 1]) + ' "$left" ' + shlex.join([*args[at + 2:], PGBENCH_THROUGH_FAULTS])
    return (f'echo "{START_MARK} $(date +%s.%N)"\n'
            f"end=$(( $(date +%s) + {max(1, round(seconds))} )); n=1; last=0\n"
            "while :; do\n"
            '  left=$(( end - $(date +%s) )); [ "$n" -gt 1 ] && [ "$left" -lt 1 ] && break; [ "$left" -lt 1 ] && '
            "left=1\n"
            '  out=pgbench; [ "$n" -gt 1 ] && out=pgbench-$n\n'
            f'  {cmd} > "$out.out" 2> "$out.err" && last=0 || last=$?\n'
            '  n=$((n+1)); [ "$last" = 0 ] && break; sleep 1\n'
            "done\n"
            "grep -qs 'number of transactions actually processed' pgbench*.out || rc=$last")


def witness_script(plan: Plan, seconds: float) -> str:
    """The witness writer in a pod: the table emptied, then one id per short transaction through ``<cluster>-rw``
    for ``seconds``, each attempt one stdout line ``pglab-witness <acked|failed|in_doubt> id t_sent t_done server
    lsn error``; then the ids read back (retried until the new primary answers) between ``present`` lines. When its
    time is up while writes fail (a failover slower than the run), it goes on, saying ``overtime``, until one is
    acknowledged (the RTO) or WITNESS_OVERTIME_S more have passed. Its time is up sooner when pglab, pgbench's Job
    ended, makes WITNESS_STOP in its RESULTS_DIR (``stop-asked``): the margin is for a pgbench that started late.

    psql makes one session per attempt (BEGIN, INSERT … RETURNING the WAL position, COMMIT): its LSN line printed
    means the INSERT returned (the COMMIT was sent next); exit 2 is a lost connection, so a lost COMMIT is in doubt,
    anything else not acked failed — the local witness's rule (``witness.classify``). An attempt still going after
    WITNESS_ATTEMPT_S is ended (``timeout``): the connection's deadlines cannot see a server that is alive but waits,
    as a COMMIT does for a synchronous standby that is gone, which would hold the witness for ever; ended after its
    INSERT returned, it is in doubt (the COMMIT may have been done locally), else failed. The table's preparation
    and the read-back have the same deadline per try."""
    # every attempt has deadlines: a connect to the old primary's address, or a session whose server was killed,
    # would otherwise wait out TCP's retries (minutes) and hide when writes came back; keepalives as pgbench's
    # (PGBENCH_THROUGH_FAULTS) for a request its lost server had received; and a deadline for the whole attempt
    psql = (f"timeout -k 2 {WITNESS_ATTEMPT_S} psql -XAtq -v ON_ERROR_STOP=1 -d 'connect_timeout=3 "
            "tcp_user_timeout=3000 keepalives_idle=2 keepalives_interval=1 keepalives_count=3'")
    create = (f"CREATE TABLE IF NOT EXISTS {WITNESS_TABLE} (id bigint PRIMARY KEY, t_client double precision NOT "
              "NULL, t_server timestamptz NOT NULL DEFAULT clock_timestamp())")
    insert = (f"INSERT INTO {WITNESS_TABLE} (id, t_client) VALUES ($i, $t0) RETURNING "
              "pg_current_wal_insert_lsn()::text || ' ' || coalesce(host(inet_server_addr()) || ':' || "
              "inet_server_port(), '-')")
    w = WITNESS_MARK
    return "\n".join([
        "set -u", "cd " + RESULTS_DIR, "nl='", "'", "n=0",
        f"until {psql} -c {shlex.quote(create)} -c 'TRUNCATE {WITNESS_TABLE}' > prepare.log 2>&1; do",
        f'  n=$((n+1)); [ "$n" -ge 60 ] && {{ echo "{w} prepare-failed $(tail -n 1 prepare.log)"; exit 1; }}; sleep 1',
        "done",
        f"end=$(( $(date +%s) + {max(1, round(seconds)) + WITNESS_MARGIN_S} )); i=0; down=0; over=0",
        "while :; do",
        '  now=$(date +%s)',
        f'  [ "$now" -lt "$end" ] && [ -e {WITNESS_STOP} ] && {{ echo "{w} stop-asked $now"; end=$now; }}',
        '  if [ "$now" -ge "$end" ]; then',
        f'    [ "$down" = 0 ] || [ "$now" -ge $((end + {WITNESS_OVERTIME_S})) ] && break',
        f'    [ "$over" = 1 ] || {{ echo "{w} overtime $now"; over=1; }}',
        "  fi",
        "  i=$((i+1)); t0=$(date +%s.%N)",
        f'  out=$({psql} -c BEGIN -c "{insert}" -c COMMIT 2>&1); rc=$?',
        "  t1=$(date +%s.%N)",
        f'  [ "$rc" = 124 ] || [ "$rc" = 137 ] && out="$out${{nl}}no answer in {WITNESS_ATTEMPT_S} s"',
        '  first=${out%%"$nl"*}; lsn=-; srv=-; stage=insert',
        '  case "$first" in [0-9A-F]*/[0-9A-F]*" "*) lsn=${first%% *}; srv=${first#* }; stage=commit;; esac',
        '  err=; if [ "$rc" = 0 ] && [ "$stage" = commit ]; then what=acked',
        '  elif [ "$stage" = commit ] && { [ "$rc" = 2 ] || [ "$rc" = 124 ] || [ "$rc" = 137 ]; }; then what=in_doubt',
        "  else what=failed; fi",
        '  [ "$what" = acked ] || err=$(printf %s "$out" | tr -s "\\n\\t " "   ")  # psql\'s words, one line',
        f'  echo "{w} $what $i $t0 $t1 $srv $lsn $err"',
        '  if [ "$what" = acked ]; then down=0; sleep 0.01; else down=1; sleep 0.2; fi',
        "done",
        f'echo "{w} stopped $i"', "n=0",
        f"until {psql} -c 'SELECT id FROM {WITNESS_TABLE} ORDER BY id' > present.txt 2> read.err; do",
        f'  n=$((n+1)); [ "$n" -ge {WITNESS_READ_TRIES} ] && {{ echo "{w} read-failed $(tail -n 1 read.err)"; '
        "exit 1; }; sleep 2",
        "done",
        f"echo \"{w} walfile $({psql} -c 'SELECT pg_walfile_name(pg_current_wal_lsn())' 2>/dev/null || true)\"",
        f'echo "{w} present begin"; cat present.txt; echo "{w} present end"',
    ])
