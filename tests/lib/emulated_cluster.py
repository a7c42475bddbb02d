"""Python side of scripts/cluster/slurm-nodes.sh (and of scripts/cluster/slurm-local.sh), for the Slurm tests and
tests/drills/node_drill.py: brings a cluster up and always down again, runs srun and sbatch against
it, waits for jobs and reads what they wrote. The emulated cluster needs root (network
namespaces)."""
import json
import os
import re
import subprocess
import time

CLUSTER_SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "cluster")
NODES_SH = os.path.join(CLUSTER_SCRIPTS, "slurm-nodes.sh")
LOCAL_SH = os.path.join(CLUSTER_SCRIPTS, "slurm-local.sh")


class Cluster:
    def __init__(self, state_dir, *up_args, script=NODES_SH):
        """`script up state_dir up_args...` starts it: slurm-nodes.sh takes N [CPUS], slurm-local.sh [CPUS]."""
        self.dir, self.up_args, self.script = os.path.abspath(state_dir), [str(a) for a in up_args], script
        self.env = dict(os.environ, SLURM_CONF=os.path.join(self.dir, "slurm.conf"), OMP_NUM_THREADS="1")

    def __enter__(self):
        self.control("up", *self.up_args)
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            self.control("down")
        except RuntimeError as e:
            if exc_type is None:
                raise
            print(f"cluster: {e} (while handling {exc_type.__name__}: {exc})")  # keep the first error

    def control(self, cmd, *args):
        """SCRIPT CMD DIR ARGS...: up, down; slurm-nodes.sh also crash, revive, link-down, link-up, slow."""
        p = subprocess.run([self.script, cmd, self.dir, *args], capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"{os.path.basename(self.script)} {cmd} {' '.join(args)}: {p.stderr.strip()}")
        return p.stdout.strip()

    def sh(self, *cmd, check=True, env=None):
        p = subprocess.run(list(cmd), capture_output=True, text=True, env=env or self.env)
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip()}")
        return p.stdout.strip()

    def srun(self, nodes, per_node, argv, timeout=300):
        """One job step on `nodes` nodes, `per_node` ranks each; returns (CompletedProcess, seconds)."""
        cmd = ["srun", f"--nodes={nodes}", f"--ntasks-per-node={per_node}", "--mpi=pmi2", "--kill-on-bad-exit=1", *argv]
        t0 = time.time()
        p = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=timeout)
        return p, time.time() - t0

    def sbatch(self, script, out, args=(), opts=(), env=None):
        """Submits `script` with its output in `out`; returns the job id."""
        return self.sh("sbatch", "--parsable", f"--output={out}", f"--chdir={os.path.dirname(out)}", *opts, script,
                       *args, env=dict(self.env, **(env or {})))

    def job(self, jid):
        return dict(re.findall(r"(\w+)=(\S+)", self.sh("scontrol", "show", "job", jid, check=False)))

    def wait_done(self, jid, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if not self.sh("squeue", "-h", "-j", jid, "-o", "%T", check=False):
                return self.job(jid)
            time.sleep(0.5)
        self.sh("scancel", jid, check=False)
        return {"JobState": "TIMEOUT_IN_TEST"}

    def job_nodes(self, jid):
        return self.sh("scontrol", "show", "hostnames", self.job(jid).get("NodeList", "")).split()

    def node_states(self):
        return dict(line.split() for line in self.sh("sinfo", "-h", "-N", "-o", "%N %t").splitlines())

    def leftovers(self):
        """What `down` must remove: the daemons of this cluster and, for the emulated one, every
        namespace, link and process left in a node's network namespace."""
        left = [f"netns {n}" for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
                if n.startswith("ptc-")]
        links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
        left += [f"link {m}" for m in re.findall(r"^\d+: (ptc-[^:@]+)", links, re.M)]
        root_netns = os.readlink("/proc/self/ns/net")  # callers run in the root namespace
        for pid in filter(str.isdigit, os.listdir("/proc")):
            if int(pid) == os.getpid():
                continue
            try:
                cmdline = open(f"/proc/{pid}/cmdline").read().replace("\0", " ").strip()
                netns = os.readlink(f"/proc/{pid}/ns/net")
            except OSError:
                continue
            in_node = self.script == NODES_SH and netns != root_netns  # a process left in a node's namespace
            if self.dir in cmdline or (in_node and re.match(r"(\S*/)?(slurm\w*|pipetrain)\b", cmdline)):
                left.append(f"pid {pid} ({cmdline})")
        return left


def metrics(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip().endswith("}")]


def losses(run_dir):
    return [(m["step"], m["loss"]) for m in metrics(run_dir)]


def latest_checkpoint_step(run_dir):
    try:
        name = open(os.path.join(run_dir, "checkpoints", "latest")).read().strip()
        return int(re.search(r"(\d+)$", name).group(1))
    except (OSError, AttributeError):
        return 0


def max_rel_diff(a, b):
    """Largest relative difference of two (step, loss) lists; inf if the steps differ."""
    if [s for s, _ in a] != [s for s, _ in b]:
        return float("inf")
    return max((abs(x - y) / max(abs(x), abs(y), 1e-30) for (_, x), (_, y) in zip(a, b)), default=0.0)


def wait_for(cond, timeout, poll=0.1):
    """Polls cond() until it holds (True) or `timeout` seconds pass (False)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(poll)
    return False


def drill_verdict(name, results, cluster):
    """A drill's last lines, once its cluster is down: what `down` left behind, then
    "<name> drills passed|FAILED: a 1/1, ..." (the line CTest matches). `results` maps each drill to
    its trials' rows (each with "ok"). True when every trial passed and nothing was left."""
    left = cluster.leftovers()
    if left:
        print(f"{name} drill: down left {left}")
    summary = ", ".join(f"{d} {sum(r['ok'] for r in rows)}/{len(rows)}" for d, rows in results.items())
    passed = all(r["ok"] for rows in results.values() for r in rows) and not left
    print(f"{name} drills {'passed' if passed else 'FAILED'}: {summary}")
    return passed
