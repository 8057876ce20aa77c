"""One SeaweedFS per pytest worker (tests/conftest.py ``seaweed``): a module that does not stop
its store gets a bucket of its own on the worker's server, and cannot stop that server for the
modules after it."""

from __future__ import annotations

import pytest
from support.seaweed import SeaweedS3

pytestmark = [pytest.mark.server]


def test_a_module_has_its_own_bucket_on_a_server_it_cannot_stop(
        seaweed: SeaweedS3, seaweed_server: SeaweedS3) -> None:
    """The module's store is the worker's server under the module's bucket; stopping, killing
    or restarting it through the module's view is refused, and the server still answers."""
    assert seaweed.endpoint == seaweed_server.endpoint
    assert seaweed.bucket == "m-test-shared-store" != seaweed_server.bucket
    for stop in (seaweed.stop, seaweed.kill, seaweed.restart, seaweed.start):
        with pytest.raises(RuntimeError, match="OWN_STORE_MODULES"):
            stop()
    client = seaweed.client()
    client.put_object(Bucket=seaweed.bucket, Key="probe", Body=b"still here")
    assert client.get_object(Bucket=seaweed.bucket, Key="probe")["Body"].read() == b"still here"
