"""The error every part of the dataset machinery raises: the lab catches it to report a failed load or reset."""


class SnapshotError(Exception):
    """A snapshot cannot be taken or restored; the message says which directory and why."""
