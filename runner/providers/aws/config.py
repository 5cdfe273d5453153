"""``clouds.aws`` of config.yaml: a model (runner/validation.py) whose errors name ``clouds.aws.KEY`` and the
fix, resolved per region into the settings every launch uses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from pydantic import Field, StrictBool, field_validator

from ...validation import Section, validate
from .errors import AWSConfigError
from .requests import RegionSettings


@dataclass(frozen=True)
class AWSSettings:
    """``clouds.aws`` of config.yaml, checked and resolved per region."""

    regions: tuple[str, ...]
    per_region: dict[str, RegionSettings]
    agent_package: str | None = None
    refresh_prices: bool = True
    checkpoint_url: str | None = None


def _is_text(value) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _text(value) -> str:
    if not _is_text(value):
        raise ValueError(f"{value!r} is not a non-empty string")
    return value.strip()


def _text_list(value) -> tuple[str, ...]:
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(_is_text(v) for v in values):
        raise ValueError("give one id or a list of ids")
    return tuple(v.strip() for v in values)


def _per_region(value, info, check) -> dict:
    """A value for every region: one for all, or a mapping {region: value} ({} when the regions were wrong)."""
    regions = info.data.get("regions")
    if value is None or regions is None:
        return {}
    if not isinstance(value, dict):
        checked = check(value)
        return {region: checked for region in regions}
    stray = sorted(set(value) - set(regions))
    if stray:
        raise ValueError(f"region {stray[0]!r} is not in clouds.aws.regions ({', '.join(regions)})")
    resolved = {}
    for region, item in value.items():
        if item is not None:
            try:
                resolved[region] = check(item)
            except ValueError as exc:
                raise ValueError(f".{region}: {exc}") from None  # the message names clouds.aws.KEY.REGION
    return resolved


# The keys checked on their own: what a good value is, and the fix for a bad one.
_PLAIN_KEYS = {
    "iam_instance_profile": (lambda v: v is None or _is_text(v), "give the instance profile's name or ARN"),
    "agent_package": (lambda v: v is None or _is_text(v), "give a pip requirement, e.g. spot-runner==0.1.0"),
    "refresh_prices": (lambda v: isinstance(v, bool), "must be true or false"),
    "checkpoint_url": (lambda v: v is None or (_is_text(v) and "://" in v), "give a bucket URL such as s3://BUCKET/PREFIX"),
}


class AWSConfig(Section):
    """The keys of ``clouds.aws`` (docs/aws.md)."""

    regions: Any = Field(default=None, validate_default=True)
    image_id: Any = Field(default=None, validate_default=True)
    subnet_id: Any = Field(default=None, validate_default=True)
    security_group_ids: Any = Field(default=None, validate_default=True)
    key_name: Any = Field(default=None, validate_default=True)
    iam_instance_profile: Optional[str] = None
    agent_package: Optional[str] = None
    refresh_prices: StrictBool = True
    checkpoint_url: Optional[str] = None

    @field_validator("regions", mode="before")
    @classmethod
    def _regions(cls, value):
        regions = [value] if isinstance(value, str) else value
        if not regions or not isinstance(regions, list) or not all(isinstance(r, str) and r for r in regions):
            raise ValueError("give a list of region names, e.g. [us-east-1]")
        return tuple(dict.fromkeys(regions))

    @field_validator("image_id", mode="before")
    @classmethod
    def _images(cls, value, info):
        images = _per_region(value, info, _text)
        missing = [r for r in info.data.get("regions") or () if not images.get(r)]
        if missing:
            raise ValueError(f"no image for region {missing[0]}; give one AMI id, or a mapping "
                             f"{{{missing[0]}: ami-...}} with an entry per region")
        return images

    @field_validator("subnet_id", mode="before")
    @classmethod
    def _subnets(cls, value, info):
        if isinstance(value, (str, list)) and len(info.data.get("regions") or ()) > 1:
            raise ValueError("a subnet belongs to one region; with several regions give a mapping "
                             "{region: subnet-... or [subnet-..., ...]}")
        return _per_region(value, info, _text_list)

    @field_validator("security_group_ids", mode="before")
    @classmethod
    def _groups(cls, value, info):
        return _per_region(value, info, _text_list)

    @field_validator("key_name", mode="before")
    @classmethod
    def _keys(cls, value, info):
        return _per_region(value, info, _text)

    @field_validator(*_PLAIN_KEYS, mode="before")
    @classmethod
    def _plain(cls, value, info):
        good, fix = _PLAIN_KEYS[info.field_name]
        if not good(value):
            raise ValueError(fix)
        return value


def parse_config(config: dict | None) -> AWSSettings:
    """Check ``clouds.aws``; raise AWSConfigError naming the key at fault."""
    if not isinstance(config, dict):
        raise AWSConfigError("clouds.aws: must be a mapping with at least regions: and image_id:")
    checked = validate(AWSConfig, config, where="clouds.aws", error=AWSConfigError)
    per_region = {
        region: RegionSettings(region=region, image_id=checked.image_id[region],
                               subnet_ids=tuple(checked.subnet_id.get(region) or ()),
                               security_group_ids=tuple(checked.security_group_ids.get(region) or ()),
                               key_name=checked.key_name.get(region), iam_instance_profile=checked.iam_instance_profile)
        for region in checked.regions
    }
    return AWSSettings(regions=checked.regions, per_region=per_region, agent_package=checked.agent_package,
                       refresh_prices=checked.refresh_prices, checkpoint_url=checked.checkpoint_url)
