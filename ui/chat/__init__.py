"""The chat in the middle of the window: its messages, composer, settings and list of chats."""
