"""The ``RUNNER_*`` variables the agent gives the job's process, and the checkpoint library reads (docs/environment.md).

The agent builds them from the controller's assignment (:func:`job_environment`); the library, a framework
callback and a job's own script read them by these names.
"""

from __future__ import annotations

PREFIX = "RUNNER_"  # the agent passes none of its own RUNNER_* variables on to the job

# Every job.
JOB_ID = "RUNNER_JOB_ID"
ATTEMPT = "RUNNER_ATTEMPT"
CHECKPOINT_DIR = "RUNNER_CHECKPOINT_DIR"          # the node-local tier
CHECKPOINT_URL = "RUNNER_CHECKPOINT_URL"          # the durable tier
CHECKPOINT_INTERVAL = "RUNNER_CHECKPOINT_INTERVAL"  # the job file's checkpoint.interval; absent for ``auto``
CHECKPOINT_KEEP = "RUNNER_CHECKPOINT_KEEP"
RESUME_STEP = "RUNNER_RESUME_STEP"                # the checkpoint the controller handed this attempt; absent: fresh
RESUME_WAIT = "RUNNER_RESUME_WAIT"  # "1": a process started ahead of its attempt waits in restore() for ``resume``
# "1" beside RUNNER_RESUME_WAIT: that process holds before its first CUDA use too (a GPU gang node's; the library's
# runner/checkpoint/cuda_gate.py)
CUDA_GATE = "RUNNER_CUDA_GATE"
CONTROL = "RUNNER_CONTROL"                        # the control socket's path (framing.py); absent without one
# Supervise mode: how long the training process lives on once its agent is gone (runner/checkpoint/agent_loss.py).
AGENT_LOSS_GRACE = "RUNNER_AGENT_LOSS_GRACE_SECONDS"
AGENT_LOSS_GRACE_SECONDS = 30.0

# Where the job's process runs, from its node's offer: which accelerator alternative it got, and whether the node
# is spot ("1") or on-demand ("0").
CLOUD = "RUNNER_CLOUD"
ZONE = "RUNNER_ZONE"
INSTANCE_TYPE = "RUNNER_INSTANCE_TYPE"
SPOT = "RUNNER_SPOT"

# A gang (docs/multinode.md); a single node is a gang of one.
NUM_NODES = "RUNNER_NUM_NODES"
NODE_RANK = "RUNNER_NODE_RANK"
NODE_IPS = "RUNNER_NODE_IPS"            # one address per line, in rank order
MASTER_ADDR = "RUNNER_MASTER_ADDR"      # node 0's address: it hosts the rendezvous
MASTER_PORT = "RUNNER_MASTER_PORT"      # fresh for each attempt
GPUS_PER_NODE = "RUNNER_GPUS_PER_NODE"  # the accelerator count of resources.accelerators (1 for CPU-only)
# Elastic gangs (docs/elastic.md): resources.min_nodes, below RUNNER_NUM_NODES; and, on a replacement joining a
# running elastic attempt, "1": its training waits in restore() for the ``world`` message and gets the state from
# a peer.
MIN_NODES = "RUNNER_MIN_NODES"
ELASTIC_JOIN = "RUNNER_ELASTIC_JOIN"

# Read by the checkpoint library when set (by the user, or a test).
MTBF_SECONDS = "RUNNER_MTBF_SECONDS"                  # interval: auto's mean time between unannounced failures
SIGNAL_GRACE_SECONDS = "RUNNER_SIGNAL_GRACE_SECONDS"  # from a SIGTERM/SIGUSR1 to the end of the machine


def job_environment(assignment: dict, local_dir: str, control_path: str | None) -> dict[str, str]:
    """The RUNNER_* variables of an assignment's job (the controller's ``/v1/agent/register`` answer):
    ``local_dir`` is the node-local tier the agent chose, ``control_path`` its control socket (None: none)."""
    checkpoint = assignment["checkpoint"]
    env = {JOB_ID: assignment["job_id"], ATTEMPT: str(assignment["attempt"]), CHECKPOINT_DIR: local_dir,
           CHECKPOINT_URL: checkpoint["durable_url"]}
    resume = checkpoint.get("resume") or {}
    if resume.get("step"):
        env[RESUME_STEP] = str(resume["step"])
    if control_path is not None:
        env[CONTROL] = control_path
        env[AGENT_LOSS_GRACE] = str(AGENT_LOSS_GRACE_SECONDS)  # a job outlives its agent this long
    env.update(gang_environment(assignment.get("gang")))
    env.update(placement_environment(assignment.get("placement")))
    if checkpoint.get("interval") and checkpoint["interval"] != "auto":
        env[CHECKPOINT_INTERVAL] = str(checkpoint["interval"])
    env[CHECKPOINT_KEEP] = str(checkpoint.get("keep", 3))
    return env


def gang_environment(gang: dict | None) -> dict[str, str]:
    """The gang variables from an assignment's ``gang`` ({} from a controller that sends none)."""
    if not gang:
        return {}
    return {
        NUM_NODES: str(gang["num_nodes"]),
        NODE_RANK: str(gang["node_rank"]),
        NODE_IPS: "\n".join(gang["node_ips"]),
        MASTER_ADDR: gang["master_addr"],
        MASTER_PORT: str(gang["master_port"]),
        GPUS_PER_NODE: str(gang["gpus_per_node"]),
        **({ELASTIC_JOIN: "1"} if gang.get("elastic_join") else {}),
        **({MIN_NODES: str(gang["min_nodes"])} if gang.get("min_nodes") else {}),
    }


def placement_environment(placement: dict | None) -> dict[str, str]:
    """RUNNER_CLOUD, RUNNER_ZONE, RUNNER_INSTANCE_TYPE and RUNNER_SPOT from an assignment's ``placement``
    (``{"cloud", "zone", "instance_type", "spot"}``); nothing from an older controller that sends none."""
    if not placement:
        return {}
    return {CLOUD: str(placement["cloud"]), ZONE: str(placement["zone"]),
            INSTANCE_TYPE: str(placement["instance_type"]), SPOT: "1" if placement["spot"] else "0"}


# The job file's ``env`` values are its secrets. Where a line of the job's own making is shown (a failure line
# from its output, its argv in the run manifest), each value of at least this many characters is shown as
# ``***``: shorter ones are settings (1, true, offline), and hiding them would blot out words.
SHORTEST_HIDDEN_VALUE = 6


def hide_values(text: str, values) -> str:
    """``text`` with each of ``values`` (the job's env values) in it shown as ``***``, the longest first."""
    for value in sorted({v for v in values if len(v) >= SHORTEST_HIDDEN_VALUE}, key=len, reverse=True):
        text = text.replace(value, "***")
    return text
