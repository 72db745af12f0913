"""The streaming replication wire side: frame encoding and one replication connection."""

from __future__ import annotations

from cdc.capture.transport.connection import CreatedSlot, ReplicationConnection
from cdc.capture.transport.framing import Frame, Keepalive, XLogData, decode_frame, encode_status

__all__ = ["CreatedSlot", "Frame", "Keepalive", "ReplicationConnection", "XLogData", "decode_frame", "encode_status"]
