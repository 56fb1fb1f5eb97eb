"""Conversations: thread logs with branches, working context, recall and named sessions."""
