"""Typed views of the custom resources' specs (pydantic), with the checks the OpenAPI schema
cannot express. A bad spec becomes an Error condition with the message from here."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from tidalmq_core.model import TopicPartition
from tidalmq_core.reassignment import PlanEntry
from tidalmq_core.topics import validate_configs, validate_topic_name


class SpecError(ValueError):
    """The spec is invalid; the message is shown in the resource's conditions."""


class _Spec(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


def config_text(value: Any) -> str:
    """A config value of a Topic or StaticTopic as Kafka's text: the CRD's schema types them
    (integers, numbers, booleans, strings; crd_configs.py), the broker takes text: booleans
    as Kafka writes them (true, false), numbers as Python prints them (Java parses those)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class TopicSpec(_Spec):
    topic_name: str | None = Field(default=None, alias="topicName")
    partitions: int = Field(ge=1, le=10_000)
    configs: dict[str, Any] = Field(default_factory=dict)

    @field_validator("configs")
    @classmethod
    def _configs(cls, value: dict[str, Any]) -> dict[str, Any]:
        return {k: config_text(v) for k, v in value.items()}

    def kafka_name(self, resource_name: str) -> str:
        name = self.topic_name or resource_name
        validate_topic_name(name)
        return name

    def validated_configs(self) -> dict[str, str]:
        return validate_configs(dict(self.configs))


class PlanPartition(_Spec):
    topic: str
    partition: int = Field(ge=0)
    replicas: list[int] = Field(min_length=1, max_length=1)


class GenerateSpec(_Spec):
    window: str = "7d"
    step: str = "1m"
    max_moves: int | None = Field(default=None, alias="maxMoves", ge=0)
    threshold: float = Field(default=1.1, ge=1.0)
    topics: list[str] | None = None


class ReassignmentSpec(_Spec):
    partitions: list[PlanPartition] | None = None
    generate: GenerateSpec | None = None
    approved: bool = False
    auto_approve: bool = Field(default=False, alias="autoApprove")
    cancel: bool = False

    def entries(self) -> list[PlanEntry]:
        seen: set[TopicPartition] = set()
        out = []
        for p in self.partitions or []:
            tp = TopicPartition(p.topic, p.partition)
            if tp in seen:
                raise SpecError(f"{tp} appears more than once")
            seen.add(tp)
            out.append(PlanEntry(tp, p.replicas[0]))
        return out


class RemapRequest(_Spec):
    queue: int = Field(ge=0)
    broker: int = Field(ge=0)
    mode: Literal["strict", "available"] = "available"  # the seed's default: availability


class StaticTopicSpec(_Spec):
    topic_name: str | None = Field(default=None, alias="topicName")
    total_queues: int = Field(alias="totalQueues", ge=1, le=1024)
    brokers: list[int] | None = None
    remap: list[RemapRequest] = Field(default_factory=list)
    configs: dict[str, Any] = Field(default_factory=dict)


def parse(model: type[_Spec], spec: dict[str, Any]) -> Any:
    try:
        return model.model_validate(dict(spec))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'spec'}: {e['msg']}" for e in exc.errors()
        )
        raise SpecError(problems) from exc
