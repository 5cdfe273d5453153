"""The AWS provider: EC2 spot and on-demand nodes, and live spot prices."""
