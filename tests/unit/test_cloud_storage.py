"""Which objects the shared Cloud Storage adapter (components/cloud/storage.py) takes for the same bytes: compared by
MD5 where both have one, else by CRC32C where both have one (https://cloud.google.com/storage/docs/hashes-etags), and
never where they share no hash."""

from __future__ import annotations

import pytest
from google.cloud.storage import Blob, Bucket

from components.cloud.storage import same_bytes


def blob(**fields: str) -> Blob:
    """An object as Cloud Storage lists it (its resource's ``size``, ``md5Hash``, ``crc32c`` where given), made as
    google-cloud-storage makes a listed one (``_item_to_blob``, google/cloud/storage/bucket.py at 3.17.1)."""
    listed = Blob("o", bucket=Bucket(None, "b"))
    listed._set_properties({"name": "o", "size": "3", **fields})
    return listed


@pytest.mark.parametrize(
    ("one", "other", "same"),
    [
        ({"md5Hash": "m1", "crc32c": "c1"}, {"md5Hash": "m1", "crc32c": "c1"}, True),
        ({"md5Hash": "m1", "crc32c": "c1"}, {"md5Hash": "m2", "crc32c": "c1"}, False),  # MD5 decides where both have it
        ({"md5Hash": "m1", "crc32c": "c1"}, {"crc32c": "c1"}, True),  # a composite object: no MD5, its CRC32C
        ({"crc32c": "c1"}, {"crc32c": "c2"}, False),
        ({"md5Hash": "m1"}, {"md5Hash": "m1"}, True),
        ({}, {}, False),  # no hash in common: not known to be the same
        ({"md5Hash": "m1"}, {"crc32c": "c1"}, False),
        ({"crc32c": "c1"}, {}, False),
        ({"size": "4", "md5Hash": "m1"}, {"md5Hash": "m1"}, False),
    ],
)
def test_same_bytes(one, other, same):
    assert same_bytes(blob(**one), blob(**other)) is same
    assert same_bytes(blob(**other), blob(**one)) is same
