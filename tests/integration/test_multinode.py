"""Multi-node, on an emulated 3-node Slurm cluster (scripts/cluster/slurm-nodes.sh: one network namespace,
IPC namespace, hostname and slurmd per node; MPI over real TCP between them):
- 2-node runs (pipeline across nodes with parallel.order = dp, data groups across nodes with
  order = pp and ZeRO-1) and a 3-node run give the single-node mpiexec run's losses (relative 1e-5), log
  the node map, and end at once (comm.finalize = auto leaves MPI without the MPI_Finalize that
  hangs over UCX/TCP);
- `pipetrain smoke` across nodes passes, flags the links of a node whose bandwidth is cut, and
  names the far end of a nearly dead link;
- `down` leaves no namespace, bridge, veth or daemon behind.
Each scenario brings its own cluster up and down. Node-failure drills are tests/drills/node_drill.py
(CTest node_drill). Exits 77 (skipped) without root."""
import contextlib
import os
import sys
from tests.lib.harness import launch, expect, fresh_module_dir, run_scenarios, scenario, settings
from tests.lib.emulated_cluster import Cluster, losses, max_rel_diff

COMMON = ["run.steps=30", "log.trace_steps=0", "comm.wait=yield", "checkpoint.every_steps=0"]


@contextlib.contextmanager
def cluster_up():
    """The emulated 3-node cluster for one scenario: all nodes idle once up, nothing left behind
    after down. Exits 77 (skipped) without root."""
    if os.geteuid() != 0:
        print("skipped: the emulated cluster needs root (network namespaces)")
        sys.exit(77)
    cluster = Cluster(fresh_module_dir("cluster"), 3)
    try:
        with cluster:
            expect(sorted(cluster.node_states().items()) == [(f"node{i}", "idle") for i in (1, 2, 3)],
                   f"3 emulated nodes idle: {cluster.node_states()}")
            yield cluster
    finally:
        left = cluster.leftovers()
        expect(not left, f"down left nothing behind ({left})")


def same_as_one_node(nodes, per_node, sets, node_map, across_nodes_only=()):
    """srun on `nodes` nodes x `per_node` ranks against the same run under mpiexec on one node;
    `node_map`: the lines of the node map the log must hold; `across_nodes_only`: settings of the
    srun run alone."""
    a = settings()
    tiny = os.path.join(a.configs, "tiny.toml")
    with cluster_up() as cluster:
        what = f"{nodes} nodes x {per_node} ranks, {' '.join(s for s in sets if 'parallel' in s)}"
        ref = launch(a, nodes * per_node, os.path.join(a.work, "ref"), tiny, COMMON + sets)
        run_dir = os.path.join(a.work, "multinode")
        argv = [a.bin, "train", "--config", tiny, "--run-dir", run_dir, "--resume", "never"]
        for s in COMMON + sets + list(across_nodes_only) + ["comm.finalize_timeout_s=20"]:
            argv += ["--set", s]
        p, seconds = cluster.srun(nodes, per_node, argv)
        expect(p.returncode == 0 and ref.rc == 0, f"{what}: srun and mpiexec runs exit 0 ({p.returncode}, {ref.rc}) "
               f"{p.stderr[-400:]}")
        diff = max_rel_diff(losses(run_dir), losses(ref.run_dir))
        expect(diff <= 1e-5, f"{what}: same losses as one node, max relative difference {diff:.2e}")
        missing = [line for line in node_map if line not in p.stdout]
        expect(not missing, f"{what}: node map logged ({missing or 'all lines'})")
        expect(seconds < 20 and "did not return" not in p.stderr and "closing barrier" not in p.stderr,
               f"{what}: the job ends cleanly without waiting out a hang ({seconds:.1f} s)")


@scenario
def pipeline_across_two_nodes():
    """2x2 on 2 nodes, parallel.order = dp (each pipeline link crosses nodes): one node's losses,
    the node map logged, a clean end."""
    same_as_one_node(2, 2, ["parallel.pp=2", "parallel.dp=2", "parallel.order=dp"],
                     ["node1: s0/d0 s0/d1", "node2: s1/d0 s1/d1",
                      "pipeline links crossing nodes: 2 of 2 | data groups spanning nodes: 0 of 2"])


@scenario
def data_groups_across_two_nodes():
    """2x2 on 2 nodes, parallel.order = pp (each data group spans nodes), with ZeRO-1 (the
    reduce-scatter and all-gather cross nodes): the losses of one node's unsharded run."""
    same_as_one_node(2, 2, ["parallel.pp=2", "parallel.dp=2", "parallel.order=pp"],
                     ["node1: s0/d0 s1/d0", "node2: s0/d1 s1/d1",
                      "pipeline links crossing nodes: 0 of 2 | data groups spanning nodes: 2 of 2"],
                     across_nodes_only=["parallel.zero=1"])


@scenario
def pipeline_across_three_nodes():
    """3 stages x 2 replicas on 3 nodes, 1F1B: the same."""
    same_as_one_node(3, 2, ["parallel.pp=3", "parallel.dp=2", "parallel.order=dp", "model.n_layer=6",
                            "parallel.micro_batches=3", "train.global_batch=12", "parallel.schedule=1f1b"],
                     ["node1: s0/d0 s0/d1", "node2: s1/d0 s1/d1", "node3: s2/d0 s2/d1",
                      "pipeline links crossing nodes: 4 of 4 | data groups spanning nodes: 0 of 3"])


def smoke_argv():
    a = settings()
    return [a.bin, "smoke", "--config", os.path.join(a.configs, "tiny.toml"), "--run-dir", os.path.join(a.work, "smoke"),
            "--set", "parallel.pp=3", "--set", "parallel.dp=2", "--set", "parallel.order=dp", "--set", "comm.wait=yield",
            "--set", "model.n_layer=3"]


@scenario
def smoke_passes_across_nodes():
    """pipetrain smoke on 3 healthy nodes passes and names the cross-node links it measured."""
    with cluster_up() as cluster:
        p, _ = cluster.srun(3, 2, smoke_argv())
        expect(p.returncode == 0 and "PASS" in p.stdout and "node1->node2" in p.stdout,
               f"smoke across 3 nodes passes and names cross-node links ({p.returncode}): {p.stdout[-300:]}")


@scenario
def smoke_flags_slow_node():
    """With node3's bandwidth cut to 20 Mbit/s, smoke fails naming node3's links and no other."""
    with cluster_up() as cluster:
        cluster.control("slow", "node3", "20mbit")
        p, _ = cluster.srun(3, 2, smoke_argv())
        verdict = p.stdout[p.stdout.find("FAIL:"):]
        expect(p.returncode != 0 and "p2p bandwidth at stage 1->2 dp 0 (node2->node3" in verdict
               and "node1->node2" not in verdict,
               f"smoke flags only the slowed node's links ({p.returncode}): {verdict.strip()[:300]}")


@scenario
def smoke_names_dead_link():
    """A nearly dead link to node3 stalls smoke's bandwidth test: it fails within comm.timeout_s
    (+ 30 s) naming the link's far end."""
    with cluster_up() as cluster:
        # 1 KB/s once a 64 KiB burst is spent: start-up still works.
        cluster.control("slow", "node3", "8kbit")
        p, seconds = cluster.srun(3, 2, smoke_argv() + ["--set", "comm.timeout_s=5"], timeout=120)
        named = [line for line in p.stderr.splitlines() if "smoke-test ping-pong with rank" in line and "on node3" in line]
        expect(p.returncode != 0 and named and seconds < 5 + 30,
               f"smoke on a broken link fails within comm.timeout_s naming it ({p.returncode}, {seconds:.0f} s): "
               f"{named[:1] or p.stderr[-300:]}")


if __name__ == "__main__":
    run_scenarios()
