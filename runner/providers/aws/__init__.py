"""The AWS provider: EC2 spot and on-demand nodes, and live spot prices (the ``aws`` extra: boto3)."""

from .provider import AWSProvider, AWSSettings, parse_config

__all__ = ["AWSProvider", "AWSSettings", "parse_config"]
