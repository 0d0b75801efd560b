"""The served model's chat format under the frontdoor's name for it: the protocol modules import it
from here. It lives in actors/lib/chat_format.py, where the gateway reads it too."""

from actors.lib.chat_format import ChatFormat

__all__ = ["ChatFormat"]
