"""Stores: content-addressed snapshots of retained engines (tracked with DVC when the store lies in a DVC repo)."""
from .dvc import DvcError, DvcRepo, dvc_command, find_dvc_root, open_repo
from .lock import FileLock, LockTimeout
from .snapshots import SnapshotInfo, SnapshotRef, SnapshotStore, StoreError, TreeRefused, UnknownSnapshotError

__all__ = ["DvcError", "DvcRepo", "FileLock", "LockTimeout", "SnapshotInfo", "SnapshotRef", "SnapshotStore", "StoreError",
           "TreeRefused", "UnknownSnapshotError", "dvc_command", "find_dvc_root", "open_repo"]
