"""Every way the gateway ends a Bedrock stream is an exception frame boto3 reads with a
code and the gateway's message, for ConverseStream and InvokeModelWithResponseStream
alike: botocore gives a type the operation's event union does not declare neither."""

from __future__ import annotations

import pytest
from botocore.eventstream import EventStreamBuffer
from botocore.exceptions import EventStreamError

from portcullis.adapters.protocols.aws_errors import stream_error
from portcullis.engine.errors import ErrorKind, GatewayError
from tests.botocore_bedrock import MODEL, boto3_converse_stream


@pytest.mark.parametrize("kind", list(ErrorKind))
def test_every_kind_ends_a_stream_in_a_declared_exception(kind: ErrorKind) -> None:
    frame = stream_error(GatewayError(kind, "the gateway's reason"))
    buffer = EventStreamBuffer()
    buffer.add_data(frame)
    declared = next(buffer).headers[":exception-type"]
    for union in ("ConverseStreamOutput", "ResponseStream"):
        assert MODEL.shape_for(union).members[declared].metadata.get("exception")
    with pytest.raises(EventStreamError) as raised:
        boto3_converse_stream(frame)
    assert raised.value.response["Error"] == {"Code": declared, "Message": "the gateway's reason"}


def test_a_withheld_answer_is_a_validation_exception() -> None:
    withheld = GatewayError(ErrorKind.PERMISSION, "withheld by the gateway's output policy (canary)", code="output_withheld")
    assert b"validationException" in stream_error(withheld)
