"""An archive wherever it lives, seen once: the user's text made a location (:func:`locate`).
"""

from __future__ import annotations

from receivewal.archive.location import DirectoryLocation, Location, is_bucket_url


def locate(text: str) -> Location:
    """The location the user's ``text`` names (:func:`~receivewal.archive.location.
    is_bucket_url` decides): a bucket's prefix (a client of the store, no request sent yet;
    ConfigurationError for a bad URL) or a directory (which need not exist: listing it says
    so)."""
    if is_bucket_url(text):
        from receivewal.archive.bucket import Bucket  # noqa: PLC0415 - boto3 only for a bucket

        return Bucket.connect(text)
    return DirectoryLocation(text)
