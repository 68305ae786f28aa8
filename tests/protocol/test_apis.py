"""The kio classes of an API version, and the entity classes of their array fields."""

from __future__ import annotations

import pytest
from kio.schema.find_coordinator.v4.response import Coordinator
from kio.schema.metadata.v12.request import MetadataRequestTopic
from kio.schema.metadata.v12.response import MetadataResponseBroker, MetadataResponseTopic

from pidctl.protocol.apis import ApiKey, entity_class, request_class, response_class


def test_an_array_fields_entity_comes_from_the_fields_type() -> None:
    metadata = response_class(ApiKey.METADATA, 12)
    assert entity_class(metadata, "topics") is MetadataResponseTopic
    assert entity_class(metadata, "brokers") is MetadataResponseBroker
    assert entity_class(request_class(ApiKey.METADATA, 12), "topics") is MetadataRequestTopic
    assert entity_class(response_class(ApiKey.FIND_COORDINATOR, 4), "coordinators") is Coordinator


def test_a_field_that_is_not_there_is_named() -> None:
    with pytest.raises(LookupError, match="no field 'nope'"):
        entity_class(response_class(ApiKey.METADATA, 12), "nope")
