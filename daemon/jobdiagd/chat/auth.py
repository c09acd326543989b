"""Who may command the daemon from a chat: allow-listed chats AND users; a separate operator list for scancel."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Sender:
    """Who pressed or typed, as the transport identifies them (ids as text)."""

    chat_id: str
    user_id: str
    user_name: str = ""

    @property
    def label(self) -> str:
        return self.user_name or self.user_id


@dataclass(frozen=True, slots=True)
class Authorizer:
    """An empty user list allows nobody: chat commands must be granted explicitly."""

    chats: frozenset[str]
    users: frozenset[str]
    operators: frozenset[str] = frozenset()

    @classmethod
    def of(
        cls, chats: Iterable[object], users: Iterable[object], operators: Iterable[object] = ()
    ) -> Authorizer:
        return cls(frozenset(map(str, chats)), frozenset(map(str, users)), frozenset(map(str, operators)))

    def chat_allowed(self, sender: Sender) -> bool:
        """A chat off the list gets no answer at all: the bot does not reveal itself there."""
        return sender.chat_id in self.chats

    def refusal(self, sender: Sender) -> str | None:
        """None when allowed; else the reason (shown to the sender, and logged)."""
        if sender.chat_id not in self.chats:
            return "this chat is not allowed to command jobdiagd"
        if sender.user_id not in self.users:
            return "you are not on jobdiagd's list of allowed users"
        return None

    def is_operator(self, sender: Sender) -> bool:
        return self.refusal(sender) is None and sender.user_id in self.operators
