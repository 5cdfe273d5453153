#!/bin/bash
# runner node bootstrap: install the agent from the controller's wheel, write its config, start it under systemd.
# Rendered per node by runner.providers.bootstrap; carries the node's own token, no cloud credentials.
set -euo pipefail

controller_url=@CONTROLLER_URL@
node_id=@NODE_ID@
node_token=@NODE_TOKEN@
cloud=@CLOUD@
zone=@ZONE@
package=@PACKAGE@
wheel=@WHEEL@
extras=@EXTRAS@
# Where things go (the defaults; a test runs this script in a throwaway folder).
opt_dir="${RUNNER_OPT_DIR:-/opt/runner}"
etc_dir="${RUNNER_ETC_DIR:-/etc/runner}"
state_dir="${RUNNER_STATE_DIR:-/var/lib/runner}"
unit_dir="${RUNNER_UNIT_DIR:-/etc/systemd/system}"

install -d -m 0755 "$opt_dir" "$state_dir/scratch"
install -d -m 0700 "$etc_dir"
if [ ! -x "$opt_dir/venv/bin/runner" ]; then
  if ! python3 -m venv "$opt_dir/venv"; then
    # Debian and Ubuntu images ship venv (ensurepip) as a separate package.
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv
    python3 -m venv --clear "$opt_dir/venv"
  fi
  if [ -n "$package" ]; then
    # clouds.CLOUD.agent_package: a requirement the node's own index serves (a private mirror, say).
    "$opt_dir/venv/bin/pip" install --quiet "$package"
  else
    # The runner itself comes from the controller, never from a package index: the wheel of the controller's
    # own version, fetched with this node's token (any of the controller URLs, until one answers). Its
    # dependencies come from the node's configured index.
    download=$(mktemp -d)
    RUNNER_NODE_TOKEN="$node_token" python3 - "$controller_url" "$download/$wheel" <<'FETCH'
import os, shutil, sys, time, urllib.error, urllib.request

urls, target = [u.strip().rstrip("/") for u in sys.argv[1].split(",") if u.strip()], sys.argv[2]
headers = {"Authorization": "Bearer " + os.environ["RUNNER_NODE_TOKEN"]}
deadline = time.monotonic() + 600
while True:
    for url in urls:
        try:
            request = urllib.request.Request(url + "/v1/agent/wheel", headers=headers)
            with urllib.request.urlopen(request, timeout=120) as answer, open(target, "wb") as out:
                shutil.copyfileobj(answer, out)
            sys.exit(0)
        except urllib.error.HTTPError as exc:
            print(f"runner bootstrap: {url} refused the wheel: HTTP {exc.code}", file=sys.stderr)
            if exc.code in (401, 403, 404):
                sys.exit(1)
        except OSError as exc:
            print(f"runner bootstrap: {url} not reachable yet: {exc}", file=sys.stderr)
    if time.monotonic() > deadline:
        sys.exit("runner bootstrap: no controller served the wheel in 10 minutes")
    time.sleep(5)
FETCH
    "$opt_dir/venv/bin/pip" install --quiet "$download/$wheel$extras"
    rm -rf "$download"
  fi
fi

# The config holds the node's token: readable by root only.
(
  umask 077
  cat >"$etc_dir/agent.yaml" <<CONFIG
controller_url: "$controller_url"
node_id: "$node_id"
token: "$node_token"
scratch_dir: "$state_dir/scratch"
cloud: "$cloud"
zone: "$zone"
CONFIG
)

# The same unit as deploy/runner-agent.service.
cat >"$unit_dir/runner-agent.service" <<'UNIT'
# The on-node agent (`runner agent`): registers with the controller, runs the job, watches for preemption.
# The bootstrap script (runner/providers/bootstrap.sh) installs this same unit on every cloud node.
[Unit]
Description=runner node agent
# Ordered after the network (and remote file systems), so at shutdown it is stopped before they go:
# the emergency checkpoint's upload and the exit report still have a network.
After=network-online.target remote-fs.target
Wants=network-online.target

[Service]
Type=notify
NotifyAccess=main
EnvironmentFile=-/etc/runner/agent.env
ExecStart=/opt/runner/venv/bin/runner agent --config /etc/runner/agent.yaml
# READY=1 once registered with the controller; the agent keeps trying to register for 300 s.
TimeoutStartSec=360
WatchdogSec=30
Restart=on-failure
RestartSec=5
# Exit 2 is a bad /etc/runner/agent.yaml: restarting will not fix it.
RestartPreventExitStatus=2
# At shutdown SIGTERM goes to the agent alone (mixed): it treats it as a preemption notice, has the job take
# an emergency checkpoint and stop, ships the output and reports the exit; whatever is left then gets
# SIGKILL. GCP powers off about 30 s after its ACPI shutdown; AWS gives 2 minutes from the spot notice.
# 120 s covers the longer one; on GCP the power-off comes first.
KillMode=mixed
TimeoutStopSec=120

# Hardening, kept to what cannot break a training job. The agent runs the job itself, so it keeps:
# root and a writable file system (`setup` installs packages; checkpoint.local_dir may be any path such as
# /mnt/nvme), the home directories (caches such as ~/.cache/huggingface), the host's /tmp, every device
# (GPUs, /dev/nvidia-uvm, InfiniBand/EFA) and kernel module loading (CUDA runs nvidia-modprobe on first use).
NoNewPrivileges=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
LockPersonality=yes

[Install]
WantedBy=multi-user.target
UNIT

systemctl daemon-reload
systemctl enable --now runner-agent.service
