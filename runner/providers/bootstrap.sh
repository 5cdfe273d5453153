#!/bin/bash
# runner node bootstrap: install the agent, write its config, start it under systemd.
# Rendered per node by runner.providers.bootstrap; carries the node's own token, no cloud credentials.
set -euo pipefail

controller_url=@CONTROLLER_URL@
node_id=@NODE_ID@
node_token=@NODE_TOKEN@
cloud=@CLOUD@
zone=@ZONE@
package=@PACKAGE@

install -d -m 0755 /opt/runner /var/lib/runner/scratch
install -d -m 0700 /etc/runner
if [ ! -x /opt/runner/venv/bin/runner ]; then
  python3 -m venv /opt/runner/venv
  /opt/runner/venv/bin/pip install --quiet "$package"
fi

umask 077
cat >/etc/runner/agent.yaml <<CONFIG
controller_url: "$controller_url"
node_id: "$node_id"
token: "$node_token"
scratch_dir: /var/lib/runner/scratch
cloud: "$cloud"
zone: "$zone"
CONFIG

cat >/etc/systemd/system/runner-agent.service <<'UNIT'
[Unit]
Description=runner node agent
After=network-online.target
Wants=network-online.target

[Service]
ExecStart=/opt/runner/venv/bin/runner agent --config /etc/runner/agent.yaml
Restart=on-failure
RestartSec=2
KillMode=mixed
TimeoutStopSec=90

[Install]
WantedBy=multi-user.target
UNIT

systemctl daemon-reload
systemctl enable --now runner-agent.service
