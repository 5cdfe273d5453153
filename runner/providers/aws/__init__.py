"""The AWS provider: EC2 spot and on-demand nodes, and live spot prices (the ``aws`` extra: boto3)."""

from .errors import AWSConfigError
from .provider import AWSProvider, AWSSettings, parse_config

__all__ = ["AWSConfigError", "AWSProvider", "AWSSettings", "parse_config"]
