"""The pgoutput logical decoding protocol: message values and a sans-IO decoder."""

from __future__ import annotations

from cdc.capture.pgoutput.decoder import Decoder
from cdc.capture.pgoutput.messages import *  # noqa: F403
from cdc.capture.pgoutput.messages import UNCHANGED, Message

__all__ = ["UNCHANGED", "Decoder", "Message"]
